"""comfy-kitchen's own quantizer as the peer of `--to comfy:<format>` (bench/comfy_out.sh): every
block Linear of a WAN f32 safetensors file (diffusers or original names) through ComfyUI's
`QuantizedTensor.from_float` and `_quantized_weight_state_dict` (eager backend, CPU), the rest
rounded to bf16, saved with safetensors. Timed whole by the caller (read, quantize, write).

Usage: QB_SRC=/tmp/qb-src python bench/comfy_out_peer.py IN.safetensors nvfp4|mxfp8|fp8|int8 OUT
"""
import re
import sys
import types
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "golden"))
import quant_base_golden as qbg  # noqa: E402

LINEAR = re.compile(r"blocks\.\d+\.(?:(?:self|cross)_attn\.[qkvo]|ffn\.[02]|attn[12]\.(?:to_[qkv]|to_out\.0)"
                    r"|ffn\.net\.(?:0\.proj|2))\.weight")
src, fmt, out = sys.argv[1], sys.argv[2], sys.argv[3]
c = qbg.comfy()
name, layout, kw = qbg.COMFY[fmt]
sd = {}
with safe_open(src, "pt") as f:
    for k in f.keys():
        t = f.get_tensor(k)
        if LINEAR.search(k):
            qt = c.qo.QuantizedTensor.from_float(t.float(), layout, **kw)
            mod = types.SimpleNamespace(weight=qt, bias=None, quant_format=name,
                                        _full_precision_mm_config=False)
            c._quantized_weight_state_dict(mod, sd, k[:-len("weight")],
                                           extra_quant_params=("input_scale", "pre_quant_scale"))
        else:
            sd[k] = t.to(torch.bfloat16)
save_file({k: v.contiguous() for k, v in sd.items()}, out)
