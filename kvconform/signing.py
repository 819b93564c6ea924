"""Optional signatures of submission bundles: a detached Ed25519 signature over SHA256SUMS.

Checksums prove a bundle's integrity; a signature proves who made it, to a receiver who has the
vendor's public key from a channel it trusts (the vendor's website, a key in a standards body's
registry). kvconform does no cryptography of its own: keys and signatures are the
``cryptography`` package's Ed25519 (the optional extra ``kvconform[sign]``), keys in PEM as
``openssl genpkey -algorithm ed25519`` writes them::

    openssl genpkey -algorithm ed25519 -out vendor-key.pem
    openssl pkey -in vendor-key.pem -pubout -out vendor-key.pub.pem
    kvconform sign-submission BUNDLE --key vendor-key.pem               # writes BUNDLE/SHA256SUMS.sig
    kvconform verify-submission BUNDLE --public-key vendor-key.pub.pem  # also checks the signature

``SHA256SUMS`` lists the sha256 of every other bundle file, so the signature covers them all.
"""

from __future__ import annotations

import base64
import binascii
import os

from kvconform.errors import InputError
from kvconform.reports.results import read_text, write_atomically
from kvconform.reports.submission import SIGNATURE, SUMS

EXTRA = "pip install 'kvconform[sign]' (the cryptography package)"


class SigningError(InputError):
    """A key or signature that cannot be used; the message names the file."""


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise SigningError(f"signing and signature checks need the cryptography package: {EXTRA}") from exc
    return serialization, ed25519, InvalidSignature


def _key(path: str, private: bool):
    serialization, ed25519, _ = _crypto()
    data = read_text(path, f"Ed25519 {'private' if private else 'public'} key (PEM)", SigningError, 1 << 16).encode()
    try:
        key = serialization.load_pem_private_key(data, password=None) if private else serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{path}: not an unencrypted PEM {'private' if private else 'public'} key ({exc})") from exc
    wanted = ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey
    if not isinstance(key, wanted):
        raise SigningError(f"{path}: a {type(key).__name__}, expected an Ed25519 key (openssl genpkey -algorithm ed25519)")
    return key


def sign(bundle: str, private_key: str) -> str:
    """Write ``bundle/SHA256SUMS.sig`` (base64 of the signature); returns its path."""
    key = _key(private_key, private=True)
    sums = read_text(os.path.join(bundle, SUMS), "bundle checksum file", SigningError, 1 << 20).encode()
    path = os.path.join(bundle, SIGNATURE)
    write_atomically(path, base64.b64encode(key.sign(sums)).decode() + "\n")
    return path


def signature_problem(bundle: str, public_key: str) -> str | None:
    """Why ``bundle``'s signature does not verify with ``public_key`` (None: it does)."""
    _, _, invalid = _crypto()
    key = _key(public_key, private=False)
    try:
        sums = read_text(os.path.join(bundle, SUMS), "bundle checksum file", SigningError, 1 << 20).encode()
        text = read_text(os.path.join(bundle, SIGNATURE), "signature (base64)", SigningError, 1 << 12)
        signature = base64.b64decode(text.strip(), validate=True)
    except SigningError as exc:
        return f"signature: {exc}"
    except (binascii.Error, ValueError):
        return f"signature: {SIGNATURE} is not base64"
    try:
        key.verify(signature, sums)
    except invalid:
        return f"signature: {SIGNATURE} does not verify with {public_key} (not signed by that key, or {SUMS} changed since)"
    return None
