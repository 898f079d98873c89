from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        # Django imports models and their users only once the app registry is ready
        from market import (
            audit,  # noqa: F401 - records sign-ins from Django's auth signals
            bookings,
            events,
            jobs,
            notify,
            tasks,
        )
        from market.api import schema  # noqa: F401 - registers the OpenAPI auth extension
        from market.streams import handlers as streams
        from market.web import login_limits

        # Who reacts to what (market/events.py). `now`: inside the announcing transaction,
        # writing with it; `after_commit`: once it commits, never when it rolls back.
        events.subscribe(
            now={
                events.TradesMatched: [notify.trades_matched],
                events.JobReached: [notify.job_reached],
                events.CheckpointKept: [jobs.checkpoint_kept],
                events.TradesMoved: [bookings.trades_moved, notify.trades_moved],
            },
            after_commit={
                events.BidChanged: [streams.bid_changed],
                events.BookChanged: [streams.book_changed],
                events.RoundCleared: [streams.round_cleared],
                events.JobsChanged: [streams.jobs_changed],
                events.MachinesChanged: [streams.machines_changed],
                events.OperatorChanged: [streams.operator_changed],
                events.BalancesChanged: [streams.balances_changed],
                events.TokenRevoked: [streams.token_revoked],
                events.UserDeactivated: [streams.user_deactivated],
                events.WebhookDeliveriesWritten: [tasks.webhook_deliveries_send],
                events.EmailsWanted: [tasks.emails_send],
                events.JobReached: [tasks.job_carbon_measure],
            },
        )

        user_login_failed.connect(login_limits.on_login_failed, dispatch_uid="market.login_limits.failed")
        user_logged_in.connect(login_limits.on_logged_in, dispatch_uid="market.login_limits.logged_in")
