"""Agent-facing endpoints, mounted at /api/v1/agent/."""

from django.urls import path

from ledger import api as ledger_api
from providers.api import views

urlpatterns = [
    path("machines/<int:machine_id>/heartbeat/", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("machines/<int:machine_id>/assignments/", views.AssignmentsView.as_view(), name="agent-assignments"),
    path("jobs/<int:job_id>/events/", views.JobEventView.as_view(), name="agent-job-events"),
    path("jobs/<int:job_id>/receipt/", views.JobReceiptView.as_view(), name="agent-job-receipt"),
    path("jobs/<int:job_id>/outputs/<path:path>", views.JobOutputUploadView.as_view(), name="agent-job-output"),
    path("challenge/", views.ChallengeView.as_view(), name="agent-challenge"),
    path("cosigns/", ledger_api.CosignListView.as_view(), name="agent-cosigns"),
    path("cosigns/<int:cosign_id>/", ledger_api.CosignSubmitView.as_view(), name="agent-cosign"),
    path("challenge/verify/", views.ChallengeVerifyView.as_view(), name="agent-challenge-verify"),
]
