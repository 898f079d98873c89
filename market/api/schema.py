"""OpenAPI extensions: how our bearer tokens appear in the schema."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "market.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gb_<prefix>_<secret>", "description": "An API token from POST /api/v1/tokens/ or your account page."}
