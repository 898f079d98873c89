"""What the ledger knows about the chain: deployments, the operator's transactions and
nonces, record and settlement batches, the blocks and events the listener has seen,
and the double-entry, hash-chained journal.

Money is integer token base units, as in market/. Hashes and addresses are
0x-prefixed hex strings; addresses are checksummed.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class Deployment(models.Model):
    """The market and token contracts on one chain. The newest active row is the one in use."""

    chain_id = models.PositiveBigIntegerField()
    rpc_url = models.CharField(max_length=255, blank=True, default="", help_text="The node this deployment was made on (the dev chain); CHAIN_RPC_URL wins when set")
    market_address = models.CharField(max_length=42)
    token_address = models.CharField(max_length=42)
    operator_address = models.CharField(max_length=42, blank=True, default="")
    deployed_block = models.PositiveBigIntegerField(default=0, help_text="The listener starts reading logs here")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["chain_id", "market_address"], name="deployment_unique_market_per_chain")]

    def __str__(self) -> str:
        return f"market {self.market_address} on chain {self.chain_id}"


class NonceCursor(models.Model):
    """The next nonce this server will use for an account it signs for. Its row lock is the
    one owner of that account's nonces across processes and restarts."""

    chain_id = models.PositiveBigIntegerField()
    address = models.CharField(max_length=42)
    next_nonce = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["chain_id", "address"], name="noncecursor_unique_account")]

    def __str__(self) -> str:
        return f"{self.address} next nonce {self.next_nonce}"


class ChainTxState(models.TextChoices):
    SIGNED = "signed"  # signed and stored, maybe not broadcast yet
    SENT = "sent"  # the node accepted it
    MINED = "mined"  # in a block, not yet deep enough
    CONFIRMED = "confirmed"  # buried under CHAIN_CONFIRMATIONS blocks, succeeded
    FAILED = "failed"  # mined and reverted


class ChainTx(models.Model):
    """One transaction this server signed. The signed bytes are stored *before* they are
    broadcast, so a crash anywhere after signing re-broadcasts the same transaction
    (same hash, same nonce) and never signs a second one for the same purpose."""

    purpose = models.CharField(max_length=32, help_text="record, settle, deposit, approve, ...")
    key = models.CharField(max_length=128, unique=True, help_text="Idempotency key: one transaction per key, ever")
    chain_id = models.PositiveBigIntegerField()
    sender = models.CharField(max_length=42)
    to = models.CharField(max_length=42, blank=True, default="")
    nonce = models.PositiveBigIntegerField()
    tx_hash = models.CharField(max_length=66, unique=True)
    raw = models.TextField(help_text="The signed transaction, hex")
    state = models.CharField(max_length=16, choices=ChainTxState.choices, default=ChainTxState.SIGNED)
    block_number = models.PositiveBigIntegerField(null=True, blank=True)
    block_hash = models.CharField(max_length=66, blank=True, default="")
    gas_used = models.PositiveBigIntegerField(null=True, blank=True)
    broadcasts = models.PositiveIntegerField(default=0)
    # fee bumping: a transaction stuck unmined is re-signed with higher fees, same nonce;
    # the hashes it replaced stay here (any of them may still be the one that is mined)
    fee_bumps = models.PositiveIntegerField(default=0)
    replaced = models.JSONField(default=list, blank=True)
    signed_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["state", "id"])]
        constraints = [
            models.UniqueConstraint(fields=["chain_id", "sender", "nonce"], name="chaintx_unique_nonce"),
            models.CheckConstraint(condition=Q(state__in=ChainTxState.values), name="chaintx_state_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} {self.tx_hash[:10]}… nonce {self.nonce} ({self.state})"


class CustodialKey(models.Model):
    """A server-held Ethereum key for a buyer without a wallet, encrypted at rest with a
    key derived from SECRET_KEY (ledger/custody.py)."""

    user = models.OneToOneField("market.User", on_delete=models.PROTECT, related_name="custodial_key")
    address = models.CharField(max_length=42, unique=True)
    ciphertext = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"custodial {self.address} of user {self.user_id}"


class BatchState(models.TextChoices):
    COLLECTING = "collecting"  # settlement: waiting for the providers' co-signatures
    SUBMITTED = "submitted"  # the transaction is signed and stored
    CONFIRMED = "confirmed"  # its event is confirmed and applied
    FAILED = "failed"  # the transaction reverted or could not be built; its trades are free again


class RecordBatch(models.Model):
    """One `record_trades` call. `number` is the contract's batch number, known from its event."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="record_batches")
    state = models.CharField(max_length=16, choices=BatchState.choices, default=BatchState.SUBMITTED)
    root = models.CharField(max_length=66, help_text="Merkle root of the trade leaves, in position order")
    number = models.PositiveBigIntegerField(null=True, blank=True)
    chain_tx = models.ForeignKey(ChainTx, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    locked = models.BigIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="recordbatch_unique_number"),
            models.CheckConstraint(condition=Q(state__in=BatchState.values), name="recordbatch_state_valid"),
        ]

    def __str__(self) -> str:
        return f"record batch {self.pk} (#{self.number}, {self.state})"


class RecordItem(models.Model):
    """A trade exactly as `record_trades` locked it (contracts.batches.RecordedTrade) and
    where it sits in its batch's tree: settlement, refunds and disputes present it again."""

    batch = models.ForeignKey(RecordBatch, on_delete=models.CASCADE, related_name="items")
    trade = models.OneToOneField("market.Trade", on_delete=models.PROTECT, related_name="record_item")
    position = models.PositiveIntegerField()
    order_id = models.PositiveBigIntegerField()
    buyer = models.CharField(max_length=42)
    provider = models.CharField(max_length=42)
    price = models.BigIntegerField()
    gpus = models.PositiveIntegerField()
    duration = models.PositiveBigIntegerField()
    deadline = models.PositiveBigIntegerField()
    leaf = models.CharField(max_length=66)

    class Meta:
        ordering = ["batch_id", "position"]
        constraints = [models.UniqueConstraint(fields=["batch", "position"], name="recorditem_unique_position")]

    def __str__(self) -> str:
        return f"trade {self.trade_id} at {self.batch_id}/{self.position}"

    @property
    def lock(self) -> int:
        return self.price * self.gpus * self.duration // 3600


class SettleBatch(models.Model):
    """One `settle_batch` call: a completion root co-signed by every provider in it."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="settle_batches")
    state = models.CharField(max_length=16, choices=BatchState.choices, default=BatchState.COLLECTING)
    root = models.CharField(max_length=66, unique=True)
    message = models.CharField(max_length=66, help_text="settlement_message(root): what the providers sign")
    chain_tx = models.ForeignKey(ChainTx, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    paid = models.BigIntegerField(default=0)
    refunded = models.BigIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.CheckConstraint(condition=Q(state__in=BatchState.values), name="settlebatch_state_valid")]

    def __str__(self) -> str:
        return f"settle batch {self.pk} ({self.state})"


class SettleItem(models.Model):
    batch = models.ForeignKey(SettleBatch, on_delete=models.CASCADE, related_name="items")
    trade = models.OneToOneField("market.Trade", on_delete=models.PROTECT, related_name="settle_item")
    record_item = models.ForeignKey(RecordItem, on_delete=models.PROTECT, related_name="+")
    index = models.PositiveIntegerField(help_text="Leaf index in the completion tree")
    gpu_seconds = models.PositiveBigIntegerField()
    digest = models.CharField(max_length=66, help_text="The receipt's digest")
    paid = models.BigIntegerField()
    refund = models.BigIntegerField()

    class Meta:
        ordering = ["batch_id", "index"]
        constraints = [models.UniqueConstraint(fields=["batch", "index"], name="settleitem_unique_index")]

    def __str__(self) -> str:
        return f"trade {self.trade_id} in settle batch {self.batch_id}"


class Cosign(models.Model):
    """A provider's BLS signature of a settlement root, asked for with the Merkle proof
    of one of its own leaves (the agent checks it before signing)."""

    batch = models.ForeignKey(SettleBatch, on_delete=models.CASCADE, related_name="cosigns")
    provider = models.ForeignKey("providers.Provider", on_delete=models.PROTECT, related_name="cosigns")
    address = models.CharField(max_length=42)
    request = models.JSONField(help_text="{trade, root, proof, index, chain_id, market}: what the agent's cosign_request takes")
    signature = models.CharField(max_length=194, blank=True, default="", help_text="96-byte compressed G2 signature, hex")
    signed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["batch_id", "address"]
        constraints = [models.UniqueConstraint(fields=["batch", "provider"], name="cosign_unique_provider_per_batch")]

    def __str__(self) -> str:
        return f"cosign of {self.address} for settle batch {self.batch_id}"


class ListenerCursor(models.Model):
    """How far the event listener has read, and applied, one deployment's logs."""

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="cursor")
    scanned_to = models.BigIntegerField(default=-1, help_text="Last block whose logs are stored")
    applied_to = models.BigIntegerField(default=-1, help_text="Last block whose events are applied (confirmed)")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"listener at {self.scanned_to} (applied {self.applied_to})"


class SeenBlock(models.Model):
    """A block the listener derived something from, or the head it last read. A stored hash
    that no longer matches the chain is a reorg: everything after the last match is undone."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="seen_blocks")
    number = models.PositiveBigIntegerField()
    hash = models.CharField(max_length=66)

    class Meta:
        ordering = ["-number"]
        constraints = [models.UniqueConstraint(fields=["deployment", "number"], name="seenblock_unique_number")]

    def __str__(self) -> str:
        return f"block {self.number} {self.hash[:10]}…"


class ChainEvent(models.Model):
    """A decoded log of the market contract. `applied` once it is confirmed and its effects
    (trade states, journal entries) are written."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    block_number = models.PositiveBigIntegerField()
    block_hash = models.CharField(max_length=66)
    tx_hash = models.CharField(max_length=66)
    log_index = models.PositiveIntegerField()
    name = models.CharField(max_length=32)
    args = models.JSONField()
    applied = models.BooleanField(default=False)

    class Meta:
        ordering = ["block_number", "log_index"]
        indexes = [models.Index(fields=["deployment", "applied", "block_number"])]
        constraints = [models.UniqueConstraint(fields=["deployment", "block_hash", "log_index"], name="chainevent_unique_log")]

    def __str__(self) -> str:
        return f"{self.name} at {self.block_number}:{self.log_index}"


class JournalEntry(models.Model):
    """One balanced movement of money: `amount` leaves `credit` and arrives in `debit`.

    Each entry commits to the previous one (`prev_hash`), so rewriting history
    anywhere breaks every later hash. Written only from confirmed chain events; one
    event may write several legs (a settlement pays and refunds per trade).
    Account names: `wallet:<addr>` (outside the market), `free:<addr>`,
    `locked:<addr>`, `stake:<addr>`, `held:<trade id>`.
    """

    seq = models.PositiveBigIntegerField(unique=True)
    hash = models.CharField(max_length=64, unique=True)
    prev_hash = models.CharField(max_length=64)
    kind = models.CharField(max_length=16, help_text="deposit, lock, pay, refund, withdraw, stake, unstake, hold, release, slash")
    debit = models.CharField(max_length=80)
    credit = models.CharField(max_length=80)
    amount = models.BigIntegerField()
    trade_id = models.BigIntegerField(null=True, blank=True)
    tx_hash = models.CharField(max_length=66)
    log_index = models.PositiveIntegerField()
    leg = models.PositiveIntegerField(default=0)
    block_number = models.PositiveBigIntegerField()
    block_hash = models.CharField(max_length=66)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["debit"]), models.Index(fields=["credit"]), models.Index(fields=["trade_id"])]
        constraints = [
            models.UniqueConstraint(fields=["tx_hash", "log_index", "leg"], name="journal_unique_leg"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="journal_amount_positive"),
            models.CheckConstraint(condition=~Q(debit=models.F("credit")), name="journal_two_accounts"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.amount} {self.credit} -> {self.debit}"
