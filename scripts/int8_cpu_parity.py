"""Int8 MiniLM parity on CPUs with and without VNNI (issue 12): the figures in docs/results/int8-cpus.md.

onnxruntime's u8s8 kernels without AVX-512 VNNI (AVX2, AVX-512BW) multiply with
vpmaddubsw, which saturates the int16 sum of two u8*s8 products; VNNI does not.
This script builds int8 variants of the exported MiniLM, encodes the same texts
through the runtime path (`OnnxSentenceEncoder`, one thread, int8 one text per
call) on each CPU, and compares them with sentence-transformers fp32.

    P=.venv/bin/python; S=scripts/int8_cpu_parity.py; D=outputs/int8_cpu_parity
    HF_HUB_OFFLINE=1 $P $S build --out $D             # native: torch, export, quantize, reference
    $P $S embed --out $D --cpu native                 # onnxruntime + tokenizers only
    qemu-x86_64 -cpu Haswell $P $S embed --out $D --cpu qemu-haswell --n-prompts 100 \
        --variants a_s8_pc b_s8_pc_rr c_u8_pc       # ~10-15 min per variant (qemu 7.2)
    $P $S latency --out $D --reps 300                 # native, interleaved, one thread
    $P $S report --out $D --json docs/results/int8-cpus.json

`embed` records a kernel probe (`u8s8_saturates`): a 1x64 MatMulInteger of
255 * 127 that is exact with VNNI and saturates to 32 * 32767 without it, so each
run says which kernel family it got (/proc/cpuinfo under qemu-user is the host's).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

N_PROMPTS = 200
N_CALIBRATION = 32  # static variant only: prompts after the first N_PROMPTS distinct ones
CSV_PATH = Path("src/replaylab/data/routellm_gsm8k/gsm8k_responses.csv")
LATENCY_TOKENS = 128


def variant_specs() -> dict[str, dict]:
    """name -> how it is quantized (written to the JSON as is)."""
    dyn = {"method": "quantize_dynamic", "op_types_to_quantize": ["MatMul"], "per_channel": True}
    return {
        "a_s8_pc": {**dyn, "weight_type": "QInt8", "reduce_range": False, "note": "shipped today"},
        "b_s8_pc_rr": {**dyn, "weight_type": "QInt8", "reduce_range": True},
        "c_u8_pc": {**dyn, "weight_type": "QUInt8", "reduce_range": False},
        "d_qdq_s8s8": {"method": "quantize_static", "quant_format": "QDQ",
                       "op_types_to_quantize": ["MatMul"], "per_channel": True,
                       "activation_type": "QInt8", "weight_type": "QInt8",
                       "calibrate_method": "MinMax", "n_calibration": N_CALIBRATION,
                       "extra_options": {"MatMulConstBOnly": True, "ActivationSymmetric": True}},
    }


def u8s8_saturates() -> dict:
    """The int8 kernel probe (`replaylab.contracts.golden.int8_kernel_probe`) in this script's keys."""
    from replaylab.contracts.golden import U8S8_EXACT, int8_kernel_probe

    probe = int8_kernel_probe()
    return {"u8s8_probe": probe["u8s8"], "u8s8_exact": U8S8_EXACT,
            "u8s8_saturates": probe["u8s8_saturates"]}


def distinct_prompts(n: int) -> list[str]:
    seen: dict[str, None] = {}
    with CSV_PATH.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            seen.setdefault(row["prompt"], None)
            if len(seen) == n:
                break
    return list(seen)


def _quiet_root():
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))  # the quantizer logs every tensor at INFO
    return root, level


def _quantize(name: str, spec: dict, src: Path, dst: Path, calib: list[dict]) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    root, level = _quiet_root()
    try:
        if spec["method"] == "quantize_dynamic":
            quantize_dynamic(src, dst, per_channel=spec["per_channel"],
                             reduce_range=spec["reduce_range"],
                             weight_type=getattr(QuantType, spec["weight_type"]),
                             op_types_to_quantize=spec["op_types_to_quantize"])
            return

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(calib)

            def get_next(self):
                return next(self.it, None)

        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=spec["op_types_to_quantize"],
                        per_channel=spec["per_channel"],
                        activation_type=getattr(QuantType, spec["activation_type"]),
                        weight_type=getattr(QuantType, spec["weight_type"]),
                        calibrate_method=CalibrationMethod.MinMax,
                        extra_options=dict(spec["extra_options"]))
    finally:
        root.setLevel(level)


def cmd_build(out: Path) -> None:
    from replaylab.artifacts.encoder_export import EDGE_CASE_TEXTS, ONNX_FP32, export_encoder
    from replaylab.router.encoder import SentenceTransformerEncoder, load_minilm

    prompts = distinct_prompts(N_PROMPTS + N_CALIBRATION)
    prompts, calibration = prompts[:N_PROMPTS], prompts[N_PROMPTS:]
    texts = {"prompts": prompts, "edge_cases": list(EDGE_CASE_TEXTS)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "texts.json").write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
    model = load_minilm()
    folder = out / "fp32"
    if not (folder / ONNX_FP32).is_file():
        export_encoder(model, folder, parity_texts=prompts, int8=False, overwrite=True)
    all_texts = prompts + list(EDGE_CASE_TEXTS)
    np.save(out / "reference_st_fp32.npy", SentenceTransformerEncoder(model).encode(all_texts))
    tok = model.tokenizer
    calib = [{k: v.astype(np.int64) for k, v in tok([t], return_tensors="np").items()
              if k in ("input_ids", "attention_mask", "token_type_ids")} for t in calibration]
    (out / "variants").mkdir(exist_ok=True)
    for name, spec in variant_specs().items():
        dst = out / "variants" / f"{name}.onnx"
        t0 = time.perf_counter()
        try:
            _quantize(name, spec, folder / ONNX_FP32, dst, calib)
            print(f"{name}: {dst.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.0f} s")
        except Exception as exc:  # an unsupported scheme is a finding, not a crash
            print(f"{name}: not built: {type(exc).__name__}: {exc}")
            dst.unlink(missing_ok=True)


def _encoders(out: Path, names: list[str] | None = None):
    """(name, OnnxSentenceEncoder) for fp32 and every built int8 variant, one thread."""
    from replaylab.runtime.encoder import CONFIG_FILE, EncoderConfig, OnnxSentenceEncoder

    folder = out / "fp32"
    raw = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    tokenizer_json = (folder / "tokenizer.json").read_text(encoding="utf-8")
    onnx_fp32 = folder / raw["variants"]["fp32"]["file"]
    paths = {"fp32": onnx_fp32, **{p.stem: p for p in sorted((out / "variants").glob("*.onnx"))}}
    for name, path in paths.items():
        if names and name not in names:
            continue
        variants = dict(raw["variants"])
        if name != "fp32":
            variants["int8"] = {"file": path.name, "encoder_id": raw["model_id"] + "+int8",
                                "per_text": True}
        config = EncoderConfig.from_dict({**raw, "variants": variants})
        yield name, OnnxSentenceEncoder.from_bytes(path.read_bytes(), tokenizer_json, config,
                                                   variant="fp32" if name == "fp32" else "int8",
                                                   threads=1)


def cmd_embed(out: Path, cpu: str, n_prompts: int, names: list[str] | None) -> None:
    import onnxruntime as ort

    texts = json.loads((out / "texts.json").read_text(encoding="utf-8"))
    rows = texts["prompts"][:n_prompts] + texts["edge_cases"]
    dest = out / "emb" / cpu
    dest.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": cpu, "onnxruntime": ort.__version__, "n_prompts": min(n_prompts,
            len(texts["prompts"])), "n_edge_cases": len(texts["edge_cases"]), **u8s8_saturates(),
            "seconds": {}}
    print(json.dumps({k: v for k, v in meta.items() if k != "seconds"}), flush=True)
    for name, enc in _encoders(out, names):
        t0 = time.perf_counter()
        np.save(dest / f"{name}.npy", enc.encode(rows))
        seconds = round(time.perf_counter() - t0, 1)
        print(f"{cpu} {name}: {seconds} s", flush=True)
        path = dest / "meta.json"  # after each variant; runs over other variants are kept
        if path.is_file():
            meta["seconds"] = json.loads(path.read_text())["seconds"]
        meta["seconds"][name] = seconds
        path.write_text(json.dumps(meta, indent=1) + "\n")


def cmd_latency(out: Path, reps: int) -> None:
    texts = json.loads((out / "texts.json").read_text(encoding="utf-8"))
    encoders = dict(_encoders(out))
    fp32 = encoders["fp32"]
    words, text = " ".join(texts["prompts"]).split(), ""
    for i in range(len(words)):  # the shortest prefix of the prompts with LATENCY_TOKENS tokens
        text = " ".join(words[:i + 1])
        if fp32.token_counts([text])[0] >= LATENCY_TOKENS:
            break
    n_tokens = int(fp32.token_counts([text])[0])
    times: dict[str, list[float]] = {name: [] for name in encoders}
    rng = np.random.default_rng(0)
    names = list(encoders)
    for rep in range(reps + 20):
        for i in rng.permutation(len(names)):
            t0 = time.perf_counter()
            encoders[names[i]].encode_one(text)
            if rep >= 20:  # warm-up
                times[names[i]].append((time.perf_counter() - t0) * 1e3)
    result = {"tokens": n_tokens, "reps": reps, "threads": 1, "cpu": _cpu_model(),
              "ms": {n: {"p50": round(float(np.percentile(t, 50)), 2),
                         "p99": round(float(np.percentile(t, 99)), 2)} for n, t in times.items()}}
    (out / "latency.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _stats(c: np.ndarray) -> dict:
    return {"min": round(float(c.min()), 5), "mean": round(float(c.mean()), 5)}


def cmd_report(out: Path, json_path: Path | None) -> None:
    from replaylab.router.encoder import cosine_rows

    texts = json.loads((out / "texts.json").read_text(encoding="utf-8"))
    n_all, n_edge = len(texts["prompts"]), len(texts["edge_cases"])
    ref = np.load(out / "reference_st_fp32.npy")
    cpus = {p.name: json.loads((p / "meta.json").read_text()) for p in sorted((out / "emb").iterdir())
            if (p / "meta.json").is_file()}
    emb = {cpu: {f.stem: np.load(f) for f in sorted((out / "emb" / cpu).glob("*.npy"))}
           for cpu in cpus}

    def ref_rows(n: int) -> np.ndarray:
        return np.concatenate([ref[:n], ref[n_all:]])

    figures: dict = {"variants": variant_specs(), "cpus": cpus, "vs_reference": {},
                     "cross_cpu": {}}
    runs = [(cpu, meta["n_prompts"], cpu) for cpu, meta in cpus.items()]
    if "native" in cpus:  # native on the same (fewer) prompts as a slower run, for a like-for-like row
        runs += [("native", n, f"native@{n}") for n in sorted({m["n_prompts"] for m in
                                                               cpus.values()})
                 if n != cpus["native"]["n_prompts"]]
    for cpu, n, label in runs:
        for name, e in emb[cpu].items():
            e = np.concatenate([e[:n], e[-n_edge:]]) if len(e) != n + n_edge else e
            c = cosine_rows(ref_rows(n), e)
            figures["vs_reference"].setdefault(name, {})[label] = {
                "n_prompts": n, "prompts": _stats(c[:n]), "edge_cases": _stats(c[n:]),
                "p01_prompts": round(float(np.quantile(c[:n], 0.01)), 5)}
    base = "native"
    for cpu in cpus:
        if cpu == base:
            continue
        n = cpus[cpu]["n_prompts"]
        for name, e in emb[cpu].items():
            if name not in emb.get(base, {}):
                continue
            b = emb[base][name]
            b = np.concatenate([b[:n], b[n_all:]]) if len(b) != len(e) else b
            c = cosine_rows(b, e)
            figures["cross_cpu"].setdefault(name, {})[f"{base}~{cpu}"] = {
                "prompts": {**_stats(c[:n]), "bit_identical_rows": int((b[:n] == e[:n]).all(1).sum())},
                "edge_cases": _stats(c[n:]), "max_abs_diff": float(np.abs(b - e).max())}
    if (out / "latency.json").is_file():
        figures["latency_native"] = json.loads((out / "latency.json").read_text())
    figures["n_edge_cases"] = n_edge
    text = json.dumps(figures, indent=1, ensure_ascii=False) + "\n"
    if json_path:
        json_path.write_text(text, encoding="utf-8")
    print("| variant | cpu | u8s8 saturates | prompts min | prompts mean | edge min | edge mean |")
    print("|---|---|---|---|---|---|---|")
    for name, per_cpu in figures["vs_reference"].items():
        for cpu, f in per_cpu.items():
            sat = cpus[cpu.split("@")[0]]["u8s8_saturates"]
            print(f"| {name} | {cpu} (n={f['n_prompts']}) | {sat} | "
                  f"{f['prompts']['min']:.4f} | {f['prompts']['mean']:.4f} | "
                  f"{f['edge_cases']['min']:.4f} | {f['edge_cases']['mean']:.4f} |")
    for name, pairs in figures["cross_cpu"].items():
        for pair, f in pairs.items():
            print(f"cross {name} {pair}: prompts min {f['prompts']['min']:.6f} mean "
                  f"{f['prompts']['mean']:.6f} identical {f['prompts']['bit_identical_rows']}; "
                  f"edge min {f['edge_cases']['min']:.6f}")
    if "latency_native" in figures:
        for name, ms in figures["latency_native"]["ms"].items():
            print(f"latency {name}: p50 {ms['p50']} ms p99 {ms['p99']} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("build", "embed", "latency", "report"))
    ap.add_argument("--out", type=Path, default=Path("outputs/int8_cpu_parity"))
    ap.add_argument("--cpu", default="native", help="label of this run's CPU (embed)")
    ap.add_argument("--n-prompts", type=int, default=N_PROMPTS)
    ap.add_argument("--variants", nargs="*", help="embed only these (default: all built)")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "build":
        cmd_build(args.out)
    elif args.command == "embed":
        cmd_embed(args.out, args.cpu, args.n_prompts, args.variants)
    elif args.command == "latency":
        cmd_latency(args.out, args.reps)
    else:
        cmd_report(args.out, args.json)


if __name__ == "__main__":
    main()
