"""Cut the fleet's shipped data (src/replaylab/data/fleet/) from the full public files, or check it.

    python scripts/fleet_data.py --data DIR            # write the shipped files from DIR
    python scripts/fleet_data.py --data DIR --check    # the shipped files equal a fresh cut
    python scripts/fleet_data.py --fits                # rewrite fitted_profiles.json only

DIR is the folder of the full downloads (layout of ../shared/data: `energy/`, `fleet/`,
`traces/azure_llm_2023/`; default $REPLAYLAB_SHARED_DATA). What is cut, from where, under
which license: src/replaylab/data/README.md.

- `mlenergy_v3_points.csv`: the header and the rows of the configurations in
  `profiles.MLENERGY_SHIPPED` of `energy/mlenergy_v3_measured.csv`, lines copied unchanged.
- `splitwise_points.csv`: the header and the rows of `profiles.SPLITWISE_SHIPPED` of
  `energy/splitwise_perf.csv`, lines copied unchanged.
- `fleetsim_gpu_profiles.json`, `azure_cdf.json`, `lmsys_cdf.json`, `agent_heavy_cdf.json`:
  copied whole from `fleet/`.
- `AzureLLMInferenceTrace_conv_first15min.csv`: the header and the rows of the first
  15 minutes of `traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv`, lines unchanged.
- `fitted_profiles.json`: the fits of every shipped configuration on the shipped points
  (`calibrate_mlenergy`, `calibrate_splitwise`: parameters, residual statistics).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from replaylab.data import shipped
from replaylab.fleet.hardware.profiles import (
    DATA_FOLDER,
    FITTED_PROFILES,
    FLEETSIM_PROFILES,
    MLENERGY_POINTS,
    MLENERGY_SHIPPED,
    SPLITWISE_POINTS,
    SPLITWISE_SHIPPED,
    calibrate_mlenergy,
    calibrate_splitwise,
    load_fleetsim_profiles,
    read_mlenergy,
    read_splitwise,
)

AZURE_SLICE = "AzureLLMInferenceTrace_conv_first15min.csv"
AZURE_SLICE_MINUTES = 15
COPIED = (FLEETSIM_PROFILES, "azure_cdf.json", "lmsys_cdf.json", "agent_heavy_cdf.json")


def kept_lines(path: Path, keep: pd.Series) -> str:
    """The header and the lines of the data rows where `keep` is true, unchanged."""
    lines = path.read_text().splitlines(keepends=True)
    rows = lines[1:]
    if len(rows) != len(keep):
        sys.exit(f"{path}: {len(rows)} lines but {len(keep)} rows (quoted newlines?)")
    return lines[0] + "".join(r for r, k in zip(rows, keep.to_numpy(), strict=True) if k)


def cut(data: Path) -> dict[str, str]:
    """name -> text of every shipped file, cut from the full files under `data`."""
    ml_path = data / "energy" / "mlenergy_v3_measured.csv"
    ml = read_mlenergy(ml_path)
    ml_keep = pd.Series(False, index=ml.index)
    for task, model, gpu, n in MLENERGY_SHIPPED:
        ml_keep |= ((ml["task"] == task) & (ml["model"] == model) & (ml["gpu"] == gpu)
                    & (ml["num_gpus"] == n))
    sw_path = data / "energy" / "splitwise_perf.csv"
    sw = read_splitwise(sw_path)
    sw_keep = pd.Series(False, index=sw.index)
    for model, hw, tp in SPLITWISE_SHIPPED:
        sw_keep |= (sw["model"] == model) & (sw["hardware"] == hw) & (sw["tensor_parallel"] == tp)
    az_path = data / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    ts = pd.to_datetime(pd.read_csv(az_path)["TIMESTAMP"], format="ISO8601")
    az_keep = ts < ts.iloc[0] + pd.Timedelta(minutes=AZURE_SLICE_MINUTES)
    out = {MLENERGY_POINTS: kept_lines(ml_path, ml_keep),
           SPLITWISE_POINTS: kept_lines(sw_path, sw_keep),
           AZURE_SLICE: kept_lines(az_path, az_keep)}
    for name in COPIED:
        out[name] = (data / "fleet" / name).read_text()
    return out


def fits() -> dict:
    """The fits of every shipped configuration on the shipped points (JSON-ready)."""
    ml = {}
    for task, model, gpu, n in MLENERGY_SHIPPED:
        cal = calibrate_mlenergy(model=model, gpu=gpu, num_gpus=n, task=task,
                                 kv_capacity_tokens=400_000)
        ml[f"{task} {model} {gpu}x{n}"] = {k: f.summary() for k, f in cal.fits.items()}
    h100 = load_fleetsim_profiles()["H100-80GB"]
    sw = {}
    for model, hw, tp in SPLITWISE_SHIPPED:
        cal = calibrate_splitwise(model=model, hardware=hw, tensor_parallel=tp,
                                  kv_capacity_tokens=200_000, power_from=h100)
        sw[f"{model} {hw} tp{tp}"] = {k: f.summary() for k, f in cal.fits.items()}
    return {"_note": "written by scripts/fleet_data.py --fits from the shipped points "
                     "(mlenergy_v3_points.csv, splitwise_points.csv); README.md",
            "mlenergy": ml, "splitwise": sw}


def fits_text() -> str:
    return json.dumps(fits(), indent=1) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=os.environ.get("REPLAYLAB_SHARED_DATA"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--fits", action="store_true", help="rewrite fitted_profiles.json only")
    args = ap.parse_args()
    folder = shipped(DATA_FOLDER)
    if args.fits:
        (folder / FITTED_PROFILES).write_text(fits_text())
        return
    if args.data is None:
        sys.exit("--data DIR (or REPLAYLAB_SHARED_DATA): the folder of the full downloads")
    files = cut(Path(args.data))
    if args.check:
        files[FITTED_PROFILES] = fits_text()
        bad = [n for n, t in files.items() if (folder / n).read_text() != t]
        print("differ: " + ", ".join(bad) if bad else f"{len(files)} files equal a fresh cut")
        sys.exit(1 if bad else 0)
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / FITTED_PROFILES).write_text(fits_text())
    print(f"wrote {len(files) + 1} files to {folder}")


if __name__ == "__main__":
    main()
