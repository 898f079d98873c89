"""SSH public keys on a buyer's account: parsed and checked here, handed to the agents of
the buyer's jobs that ask for `ssh`, which put them in the container's
/root/.ssh/authorized_keys.

A key is one OpenSSH public-key line, `<type> <base64 body> [comment]`. The body is the
key in SSH wire format, whose first field repeats the type; it is parsed, not just
decoded, so a truncated or mislabelled key is refused here rather than by sshd later.
The fingerprint is OpenSSH's: `SHA256:` and the unpadded base64 of the body's SHA-256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from market.errors import Conflict, DomainError, NotFound
from market.models import SshKey, User

MAX_KEY_CHARS = 8192  # a 16384-bit RSA key is about 2.8 KB of base64
MAX_KEYS_PER_USER = 32
MIN_RSA_BITS = 2048
ECDSA_CURVES = {"ecdsa-sha2-nistp256": ("nistp256", 65), "ecdsa-sha2-nistp384": ("nistp384", 97), "ecdsa-sha2-nistp521": ("nistp521", 133)}
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", *ECDSA_CURVES)
NAME_RE = re.compile(r"^[A-Za-z0-9_.@:+-][A-Za-z0-9 _.@:+-]{0,63}$")


class KeyInvalid(ValueError):
    pass


@dataclass(frozen=True)
class ParsedKey:
    type: str
    body: str  # base64, as given
    comment: str
    fingerprint: str

    @property
    def line(self) -> str:
        """The key as an authorized_keys line (no comment: the account names it)."""
        return f"{self.type} {self.body}"


def _fields(blob: bytes) -> list[bytes]:
    """The length-prefixed strings of an SSH wire-format blob."""
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise KeyInvalid("the key's body is truncated")
        n = int.from_bytes(blob[i : i + 4], "big")
        if n > len(blob) - i - 4:
            raise KeyInvalid("the key's body is truncated")
        out.append(blob[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def key_parse(text: str) -> ParsedKey:
    """One OpenSSH public key line, checked; raises KeyInvalid saying what is wrong."""
    text = text.strip()
    if not text:
        raise KeyInvalid("paste a public key, e.g. the contents of ~/.ssh/id_ed25519.pub")
    if len(text) > MAX_KEY_CHARS:
        raise KeyInvalid(f"a public key is at most {MAX_KEY_CHARS} characters")
    if "\n" in text or "\r" in text:
        raise KeyInvalid("one key per entry: the text has more than one line")
    if "PRIVATE KEY" in text:
        raise KeyInvalid("this is a private key: never share it. Paste the .pub file instead")
    parts = text.split(None, 2)
    kind = parts[0]
    if kind not in KEY_TYPES:
        raise KeyInvalid(f"unsupported key type {kind[:40]!r}; use one of {', '.join(KEY_TYPES)}")
    if len(parts) < 2:
        raise KeyInvalid("the key has a type but no base64 body")
    body, comment = parts[1], (parts[2] if len(parts) > 2 else "")
    try:
        blob = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise KeyInvalid("the key's body is not valid base64") from None
    fields = _fields(blob)
    if not fields or fields[0] != kind.encode():
        raise KeyInvalid(f"the key's body is not a {kind} key")
    if kind == "ssh-ed25519":
        if len(fields) != 2 or len(fields[1]) != 32:
            raise KeyInvalid("an ssh-ed25519 key holds 32 bytes")
    elif kind == "ssh-rsa":
        if len(fields) != 3:
            raise KeyInvalid("an ssh-rsa key holds an exponent and a modulus")
        bits = int.from_bytes(fields[2], "big").bit_length()
        if bits < MIN_RSA_BITS:
            raise KeyInvalid(f"this RSA key has {bits} bits; use at least {MIN_RSA_BITS} (or an ed25519 key)")
    else:
        curve, point = ECDSA_CURVES[kind]
        if len(fields) != 3 or fields[1] != curve.encode() or len(fields[2]) != point or fields[2][:1] != b"\x04":
            raise KeyInvalid(f"the key's body is not a valid {kind} key")
    return ParsedKey(kind, body, comment.strip()[:200], fingerprint(blob))


# --- services ------------------------------------------------------------------------------
@transaction.atomic
def ssh_key_add(*, user: User, name: str, public_key: str) -> SshKey:
    """Add a key to the account; the same key twice is refused, as is a name used already."""
    try:
        parsed = key_parse(public_key)
    except KeyInvalid as exc:
        raise DomainError(f"Not a usable SSH public key: {exc}.", fields={"public_key": [str(exc).capitalize() + "."]}) from None
    name = name.strip() if name else (re.sub(r"[^A-Za-z0-9 _.@:+-]+", "-", parsed.comment).strip(" -")[:64].strip() or parsed.type)
    if not NAME_RE.match(name):
        raise DomainError("Bad key name.", fields={"name": ["1-64 letters, digits, spaces or _ . @ : + -"]})
    User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True).first()
    if SshKey.objects.filter(owner=user).count() >= MAX_KEYS_PER_USER:
        raise Conflict(f"An account holds at most {MAX_KEYS_PER_USER} SSH keys; remove one first.")
    same = SshKey.objects.filter(owner=user, fingerprint=parsed.fingerprint).first()
    if same is not None:
        raise Conflict(f"This key is on your account already, as {same.name!r} ({parsed.fingerprint}).", fields={"public_key": ["Already added."]})
    if SshKey.objects.filter(owner=user, name=name).exists():
        raise Conflict(f"You have a key named {name!r} already; choose another name.", fields={"name": ["Taken."]})
    try:
        with transaction.atomic():
            return SshKey.objects.create(owner=user, name=name, key_type=parsed.type, public_key=parsed.line, fingerprint=parsed.fingerprint)
    except IntegrityError:
        raise Conflict("This key or name is on your account already.") from None


@transaction.atomic
def ssh_key_delete(*, user: User, key_id: int) -> SshKey:
    key = SshKey.objects.select_for_update().filter(pk=key_id, owner=user).first()
    if key is None:
        raise NotFound(f"No SSH key {key_id} of yours.")
    key.delete()
    return key


def authorized_keys(user: User) -> list[str]:
    """The account's keys as authorized_keys lines, oldest first."""
    return [f"{k.public_key} gridbid:{k.name.replace(' ', '_')}" for k in SshKey.objects.filter(owner=user).order_by("id")]
