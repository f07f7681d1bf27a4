"""Write the model cards of zoo/translate from the training reports (and, with --rescore, measure BLEU / chrF again).

    PYTHONPATH=src python scripts/translate_cards.py [--rescore] [--data ../shared/data/multi30k_en_de]

target/, draft/ and draft-aligned/: README.md from training_report.json (train/seq2seq_card.py); --rescore first
replaces the report's scores with greedy val / test_2016_flickr (and --beam B test_2016_flickr), measured here.
draft-aligned/'s card also gets BiLD's before / after from --alignment-bench (bench-translate's JSON), when it exists.
nat/: README.md from nat.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftverify.train.seq2seq_card import model_card, nat_card

ROLES = {"target": "target", "draft": "small", "draft-aligned": "small-aligned"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zoo", type=Path, default=Path("zoo/translate"))
    ap.add_argument("--data", default="../shared/data/multi30k_en_de")
    ap.add_argument("--rescore", action="store_true")
    ap.add_argument("--beam", type=int, default=0, help="with --rescore: also test_2016_flickr with this beam size")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--alignment-bench", type=Path, default=Path("benchmarks/translate-bild-aligned.json"),
                    help="bench-translate JSON with the original and aligned small models (draft-aligned's card)")
    args = ap.parse_args()
    for folder, role in ROLES.items():
        path = args.zoo / folder / "training_report.json"
        if not path.is_file():
            print(f"skip {folder}: no training_report.json")
            continue
        report = json.loads(path.read_text())
        report["role"] = role
        if folder == "draft-aligned" and args.alignment_bench.is_file():
            report["bild_alignment"] = json.loads(args.alignment_bench.read_text())
        if args.rescore:
            report["scores"] = rescore(args.zoo / folder, args.data, report["languages"], args.threads, args.beam)
            path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        (args.zoo / folder / "README.md").write_text(model_card(report))
        print(f"{folder}: " + ", ".join(f"{k} BLEU {v['bleu']:.2f} chrF {v['chrf']:.2f}" for k, v in report["scores"].items()))
    nat = args.zoo / "nat" / "nat.json"
    if nat.is_file():
        (args.zoo / "nat" / "README.md").write_text(nat_card(json.loads(nat.read_text())))
        print("nat: card written")


def rescore(folder: Path, data: str, languages: list[str], threads: int, beam: int) -> dict:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from draftverify.train.seq2seq import score_split

    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    src, tgt = languages
    scores = {"val": score_split(model, tok, data, "val", src, tgt),
              "test_2016_flickr": score_split(model, tok, data, "test_2016_flickr", src, tgt)}
    if beam > 1:
        scores[f"test_2016_flickr_beam{beam}"] = score_split(model, tok, data, "test_2016_flickr", src, tgt, num_beams=beam)
    return scores


if __name__ == "__main__":
    main()
