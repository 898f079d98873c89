"""Agent-facing endpoints, mounted at /api/v1/agent/ (the co-signing ones, cosigns/, are
the ledger's: gridbid/urls.py mounts them beside these)."""

from django.urls import path

from providers.api import views

urlpatterns = [
    path("machines/<int:machine_id>/heartbeat/", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("machines/<int:machine_id>/assignments/", views.AssignmentsView.as_view(), name="agent-assignments"),
    path("machines/<int:machine_id>/offline/", views.MachineOfflineView.as_view(), name="agent-machine-offline"),
    path("jobs/<int:job_id>/events/", views.JobEventView.as_view(), name="agent-job-events"),
    path("jobs/<int:job_id>/receipt/", views.JobReceiptView.as_view(), name="agent-job-receipt"),
    path("jobs/<int:job_id>/outputs/<path:path>", views.JobOutputUploadView.as_view(), name="agent-job-output"),
    path("speedtest/", views.SpeedtestView.as_view(), name="agent-speedtest"),
    path("challenge/", views.ChallengeView.as_view(), name="agent-challenge"),
    path("challenge/verify/", views.ChallengeVerifyView.as_view(), name="agent-challenge-verify"),
]
