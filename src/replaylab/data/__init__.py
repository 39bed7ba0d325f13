"""Data shipped with the package (found with importlib.resources, never by path arithmetic),
and the public files it was cut from, which a run may name instead.

What each shipped file is, where it came from, how it was cut or fitted, its license and
its citation: `README.md` in this folder. `shipped(...)` is the path of one of them;
`PUBLIC_FILES` says what each full public file is and where to download it, and
`require_public(path, key, setting)` turns a named-but-absent one into one line
(a FileNotFoundError: the entry points print `error: <line>` and exit 2).
Nothing here reads a file at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

__all__ = ["PUBLIC_FILES", "PublicFile", "require_public", "shipped"]


def shipped(*parts: str) -> Path:
    """The path of a file shipped in this package, e.g. shipped("fleet", "azure_cdf.json")."""
    return Path(str(files(__name__).joinpath(*parts)))


@dataclass(frozen=True)
class PublicFile:
    """A public file (or folder) that is not shipped whole: what it is, its license, where
    to get it."""

    what: str
    license: str
    url: str

    @property
    def where(self) -> str:
        """How to get it, in words: a download address, or (a ledger) how to make one."""
        return self.url if self.url.startswith("make ") else f"download it from {self.url}"


PUBLIC_FILES: dict[str, PublicFile] = {
    "azure_conv": PublicFile(
        "the Azure LLM inference trace 2023, conversation service "
        "(AzureLLMInferenceTrace_conv.csv, 19,366 requests, ~1 h)", "CC-BY-4.0",
        "https://github.com/Azure/AzurePublicDataset/blob/master/AzureLLMInferenceDataset2023.md"),
    "azure_code": PublicFile(
        "the Azure LLM inference trace 2023, code service "
        "(AzureLLMInferenceTrace_code.csv, 8,819 requests, ~1 h)", "CC-BY-4.0",
        "https://github.com/Azure/AzurePublicDataset/blob/master/AzureLLMInferenceDataset2023.md"),
    "servegen": PublicFile(
        "a ServeGen folder of per-client rate traces (e.g. language/m-large: "
        "chunk-N-trace.csv, 14 days of 10-minute windows)", "Apache-2.0",
        "https://github.com/alibaba/ServeGen"),
    "mlenergy": PublicFile(
        "ML.ENERGY leaderboard v3 measurements, one row per served configuration "
        "(task, model, gpu, num_gpus, max_num_seqs, avg_batch, power_per_gpu_W, "
        "output_tok_per_s, itl_p99_ms, ...)", "cite ML.ENERGY leaderboard v3",
        "https://ml.energy/leaderboard"),
    "splitwise": PublicFile(
        "Splitwise's measured prompt and token step times (model, hardware, prompt_size, "
        "batch_size, token_size, prompt_time, token_time, tensor_parallel, ...)", "MIT",
        "https://github.com/Mutinifni/splitwise-sim (data/perf_model.csv)"),
    "fleetsim": PublicFile(
        "FleetSim's GPU profiles (vllm-project/semantic-router src/fleet-sim, read out of its "
        "gpu_profiles module)", "Apache-2.0",
        "https://github.com/vllm-project/semantic-router (src/fleet-sim)"),
    "token_cdf": PublicFile(
        "a token-demand CDF in FleetSim's JSON ([[total tokens, cumulative share], ...])",
        "Apache-2.0", "https://github.com/vllm-project/semantic-router (src/fleet-sim)"),
    "ledger": PublicFile(
        "a ledger-v1 file (Parquet or JSON Lines)", "its trace's license",
        "make one from a public trace with `python -m training pipeline=import "
        "source=<name> out=FILE` (docs/howto/import-data.md)"),
}


def require_public(path: str | Path, key: str, setting: str, *, folder: bool = False) -> Path:
    """`path` when it exists (a file, or a folder when `folder`); else FileNotFoundError
    with one line: the setting that named it, what the file is and where to download it."""
    p = Path(path)
    if p.is_dir() if folder else p.is_file():
        return p
    f = PUBLIC_FILES[key]
    raise FileNotFoundError(f"{setting}={p}: no such {'folder' if folder else 'file'}; it "
                            f"names {f.what} ({f.license}); {f.where}")
