# Prints the per-encoding error summary of a quantized release's manifest (BENCHMARKS.md,
# Quantized outputs). Usage: quant_summary.py MANIFEST
import json, sys

q = json.load(open(sys.argv[1]))["report"]["quantization"]
for enc, s in sorted(q["summary"].items()):
    print(f"| {q['format']} | {enc} | {s['tensors']} | {s['worst_rel_max_err']:.3g} | "
          f"{s['worst_rel_rms_err']:.3g} |")
