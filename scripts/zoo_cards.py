"""Write the model cards of zoo/code/{target,draft,draft-aligned} from the reports the GPU scripts saved.

Every figure on a card comes from training_report.json / alignment_report.json (written by
scripts/train_zoo_gpu.py and scripts/align_zoo_gpu.py) or from zoo/code/manifest.json and held_out.json
(written by scripts/zoo_held_out.py); nothing is typed by hand.
Usage: python scripts/zoo_cards.py [zoo/code]
"""
import json
import sys
from collections import Counter
from pathlib import Path

zoo = Path(sys.argv[1] if len(sys.argv) > 1 else "zoo/code")
manifest = json.loads((zoo / "manifest.json").read_text())
held_out = json.loads((zoo / "held_out.json").read_text()) if (zoo / "held_out.json").is_file() else None
files_per_licence = Counter(f.get("license", "?") for f in manifest["files"])

TERMS = (
    "Multi-source code corpus: the `.py` files of the CPython standard library (PSF-2.0) and of "
    f"{len(manifest['sources']) - 1} permissively licensed packages from PyPI, each file's licence recorded in "
    "`zoo/code/manifest.json` (built by `draftverify train corpus`); packages whose metadata names a copyleft "
    "licence are skipped. Identical files are kept once; the validation split is held out by file."
)


def data_section() -> str:
    total = manifest["bytes"]["train"] + manifest["bytes"]["val"]
    rows = "\n".join(f"| `{s['name']}` | {s['version']} | {s['license']} |" for s in manifest["sources"])
    return (
        f"## Data\n\n{TERMS}\n\n"
        f"- Files: {manifest['counts']['train']:,} train / {manifest['counts']['val']:,} validation "
        f"({total / 1e6:.1f} MB); {len(manifest['skipped']):,} skipped (non-UTF-8, empty, NUL bytes or duplicates).\n"
        f"- Manifest hash: `{manifest['files_sha256']}`\n"
        f"- Files per licence: " + ", ".join(f"{k} {v:,}" for k, v in files_per_licence.most_common()) + "\n\n"
        f"<details><summary>Sources ({len(manifest['sources'])})</summary>\n\n| source | version | licence |\n|---|---|---|\n"
        f"{rows}\n\n</details>\n"
    )


def lm_card(kind: str, report: dict, command: str, extra: str = "") -> str:
    c = report["config"]
    held = ""
    if held_out and kind in held_out["models"]:
        h = held_out["models"][kind]
        held = "".join(f"- Held-out loss on {name}: {v:.4f} nats/token\n" for name, v in h.items())
    return f"""---
library_name: transformers
pipeline_tag: text-generation
license: apache-2.0
tags: [draftverify, code, python, llama, speculative-decoding]
---

# draftverify code-{kind} ({report['parameters'] / 1e6:.2f}M parameters)

A small `LlamaForCausalLM` trained from scratch as the *{kind}* model of draftverify's code pair (speculative
decoding experiments). It completes Python source; it is a toy, not a general code assistant.

{data_section()}
## Model

- Parameters: {report['parameters']:,} (tied input/output embeddings)
- hidden {c['hidden_size']}, layers {c['num_hidden_layers']}, heads {c['num_attention_heads']} (kv {c['num_key_value_heads']}), intermediate {c['intermediate_size']}, max positions {c['max_position_embeddings']}
- Tokenizer: the zoo's byte-level BPE (vocab {c['vocab_size']}, `<|endoftext|>` = bos/eos), documents joined with eos.
- Weights in float16 (safetensors); trained in bf16 autocast with fp32 master weights.

## Training

```
{command}
```

- Hardware: one {report['device']} (torch {report['torch']}), lent to a development session for minutes.
- Sequence length {report['seq_len']}, batch {report['batch']} sequences, AdamW (0.9, 0.95), weight decay 0.1, peak LR {report['lr']}, {report['warmup_steps']} warm-up steps, cosine decay to 0.1x over the time budget, grad clip 1.0.
- Steps: {report['steps']:,}; tokens seen: {report['tokens_seen']:,} ({report['epochs']:.2f} epochs of {report['train_tokens']:,} training tokens)
- Training time: {report['train_minutes']:.1f} min ({report['total_minutes']:.1f} min with tokenization and export).
- Held-out loss: {report['val_loss_64x512']:.4f} nats/token on 64 evenly spaced 512-token validation windows; {report['val_loss_all_windows']:.4f} on all {report['val_windows_all']:,} non-overlapping windows ({report['val_tokens']:,} validation tokens).
{held}{extra}
## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path)
```
"""


target = json.loads((zoo / "target" / "training_report.json").read_text())
draft = json.loads((zoo / "draft" / "training_report.json").read_text())
aligned = json.loads((zoo / "draft-aligned" / "alignment_report.json").read_text())
gpu = "PYTHONPATH=src python scripts/train_zoo_gpu.py --tokenizer zoo/code/tokenizer --bundle .gpu/corpus"
early = (
    f"- Early exit (BiLD section 4.4): the last {target['early_exit_share']:.0%} of the budget trained on the average "
    f"of the final layer's loss and layer {target['early_exit_layer']}'s (through the shared norm and head). Layer "
    f"{target['early_exit_layer']}'s held-out loss went {target['before_early_exit_phase'][1]:.4f} -> "
    f"{target['val_loss_early_exit_64x512']:.4f}; the full model's {target['before_early_exit_phase'][0]:.4f} -> "
    f"{target['val_loss_64x512']:.4f} (kept: the bound is +{target['max_degradation']} nats). `--method early_exit "
    f"--early-exit-layers {target['early_exit_layer']}` uses it as a shared-weight small model.\n"
)
(zoo / "target" / "README.md").write_text(lm_card(
    "target", target, f"{gpu} --role target --out zoo/code/target --minutes 9 --early-exit-layer 2 --early-exit-share 0.2",
    early))
(zoo / "draft" / "README.md").write_text(lm_card(
    "draft", draft, f"{gpu} --role draft --out zoo/code/draft --minutes 7 --lr 2e-3"))
aligned_card = lm_card("draft", draft, f"{gpu} --role draft --out zoo/code/draft --minutes 7 --lr 2e-3").replace(
    "# draftverify code-draft", "# draftverify code-draft-aligned", 1)
aligned_card += f"""
## Prediction alignment (BiLD section 3.2)

The draft above, fine-tuned on the target's own greedy continuations:

```
PYTHONPATH=src python scripts/align_zoo_gpu.py --target zoo/code/target --draft zoo/code/draft --out zoo/code/draft-aligned \\
    --num-prompts {aligned['num_prompts']} --minutes {aligned['train_minutes']} --lr {aligned['lr']}
```

- {aligned['num_prompts']:,} prompts of {aligned['prompt_len']} tokens from the training split, {aligned['new_tokens']} target greedy tokens each (bf16 on the GPU, {aligned['generation_minutes']:.1f} min); {aligned['steps']:,} steps of {aligned['batch']} sequences, loss on the continuation tokens only, on one {aligned['device']}.
- Greedy agreement with the target on {aligned['val_prompts']} held-out prompts (validation split), i.e. the greedy acceptance rate alpha: {aligned['greedy_agreement_before']:.4f} before -> {aligned['greedy_agreement_after']:.4f} after.
- The target's early-exit view (first {aligned['early_exit_layers']} layers) on the same data: {aligned['early_exit_greedy_agreement']:.4f}.
"""
(zoo / "draft-aligned" / "README.md").write_text(aligned_card)
print("cards written:", *(zoo / d / "README.md" for d in ("target", "draft", "draft-aligned")))
