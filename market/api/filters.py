from typing import Any

from django import forms
from django_filters import rest_framework as filters

from market.models import AuctionRound, AuditAction, AuditEvent, Bid, Offer, Trade
from market.selectors import bids_search
from providers.catalogue import cuda_code
from providers.models import Runtime

TRUE_FALSE = [("true", "true"), ("false", "false")]


def _true(value: str) -> bool:
    return value == "true"


class CudaField(forms.CharField):
    """A CUDA version like 12 or 12.4, as its code (major x 100 + minor)."""

    def clean(self, value: Any) -> int | None:
        value = super().clean(value)
        if not value:
            return None
        try:
            return cuda_code(value)
        except ValueError as exc:
            raise forms.ValidationError(f"{exc}.") from None


class CudaFilter(filters.Filter):
    field_class = CudaField


class OfferFilter(filters.FilterSet):
    gpu_model = filters.CharFilter(field_name="gpu_model_id", help_text="Catalogue model id, e.g. H100-SXM-80GB")
    region = filters.CharFilter(field_name="machine__region_id")
    min_gpus = filters.NumberFilter(field_name="gpus_free", lookup_expr="gte", min_value=0, help_text="At least this many free GPUs")
    min_memory_gib = filters.NumberFilter(field_name="gpu_model__memory_gib", lookup_expr="gte", min_value=0)
    min_compute_units = filters.NumberFilter(field_name="gpu_model__compute_units", lookup_expr="gte", min_value=0)
    max_price = filters.NumberFilter(field_name="price", lookup_expr="lte", min_value=0)
    min_reliability = filters.NumberFilter(field_name="machine__reliability", lookup_expr="gte", min_value=0, max_value=1)
    vendor = filters.CharFilter(field_name="gpu_model__vendor")
    machine = filters.NumberFilter(field_name="machine_id", min_value=1)
    state = filters.ChoiceFilter(choices=Offer._meta.get_field("state").choices)
    # typed choices, not BooleanFilter: that one takes "perhaps" as no filter at all
    runs_containers = filters.TypedChoiceFilter(field_name="machine__runs_containers", choices=TRUE_FALSE, coerce=_true,
                                                help_text="true: machines that run container images (docker or podman)")
    publishes_ports = filters.TypedChoiceFilter(field_name="machine__publishes_ports", choices=TRUE_FALSE, coerce=_true,
                                                help_text="true: machines that publish ports and SSH")
    runtime = filters.ChoiceFilter(field_name="machine__runtime", choices=Runtime.choices, help_text="How the machine's agent runs jobs")
    min_cuda = CudaFilter(field_name="machine__cuda", lookup_expr="gte", help_text="At least this CUDA version, like 12 or 12.4")
    min_ram_gib = filters.NumberFilter(field_name="machine__ram_gib", lookup_expr="gte", min_value=0, help_text="The machine's RAM, GiB")
    min_disk_gb = filters.NumberFilter(field_name="machine__disk_gb", lookup_expr="gte", min_value=0, help_text="Free disk for jobs, GB")
    min_net_down_mbps = filters.NumberFilter(field_name="machine__net_down_mbps", lookup_expr="gte", min_value=0, help_text="Measured download, Mbit/s")
    min_net_up_mbps = filters.NumberFilter(field_name="machine__net_up_mbps", lookup_expr="gte", min_value=0, help_text="Measured upload, Mbit/s")

    class Meta:
        model = Offer
        fields: list[str] = []


class BidFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=Bid._meta.get_field("state").choices)
    klass = filters.ChoiceFilter(choices=Bid._meta.get_field("klass").choices)
    client_order_id = filters.CharFilter()
    since = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte", help_text="Placed at or after: ISO 8601, e.g. 2026-01-31T00:00:00Z")
    until = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt", help_text="Placed before: ISO 8601")
    q = filters.CharFilter(method="search", max_length=100,
                           help_text="Search: a bid id (123 or #123), or part of its client_order_id, a GPU model or its job's image")

    def search(self, qs: Any, name: str, value: str) -> Any:
        return bids_search(qs, value)

    class Meta:
        model = Bid
        fields: list[str] = []


class TradeFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=Trade._meta.get_field("state").choices)
    bid = filters.NumberFilter(field_name="bid_id", min_value=1)
    round = filters.NumberFilter(field_name="round__number", min_value=0)

    class Meta:
        model = Trade
        fields: list[str] = []


class RoundFilter(filters.FilterSet):
    """A range of rounds by number, to backfill the `rounds` channel (docs/stream.md)."""

    number_from = filters.NumberFilter(field_name="number", lookup_expr="gte", min_value=0, help_text="Rounds numbered this or above")
    number_to = filters.NumberFilter(field_name="number", lookup_expr="lte", min_value=0, help_text="Rounds numbered this or below")
    state = filters.ChoiceFilter(choices=AuctionRound._meta.get_field("state").choices)

    class Meta:
        model = AuctionRound
        fields: list[str] = []


class AuditFilter(filters.FilterSet):
    actor = filters.NumberFilter(field_name="actor_id", min_value=1, help_text="Operators: whose actions (a user id)")
    action = filters.ChoiceFilter(choices=AuditAction.choices)
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte", help_text="ISO 8601, e.g. 2026-01-31T00:00:00Z")

    class Meta:
        model = AuditEvent
        fields: list[str] = []
