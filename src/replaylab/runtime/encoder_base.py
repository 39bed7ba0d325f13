"""What both encoder tiers share, without their libraries: the artifact kind and its error.

`replaylab.runtime.encoder` (MiniLM: onnxruntime, tokenizers) and
`replaylab.runtime.static_encoder` (numpy only) import these from here, so the
static tier loads without onnxruntime or tokenizers installed.
"""

from __future__ import annotations

from replaylab.contracts.manifest import ManifestError

KIND = "encoder"  # manifest kind of an encoder folder, either tier


class EncoderArtifactError(ManifestError):
    """The folder verified but this runtime cannot use it (`reason` names what)."""
