"""Agent-facing endpoints, mounted at /api/v1/agent/ (owned by the provider-agent work)."""

urlpatterns: list = []
