"""The README against its goals: its word count, its mean sentence length, and the line of the first command
the video types. Exits 1 when a goal is missed (dev/check_docs.py runs it, and so does CI).

Words are counted as `wc -w` counts them, over the whole file. Sentences are the prose's: fenced code, tables,
headings, images and HTML comments left out, links read as their text; a sentence ends at . ! or ? before a
space, and at the end of a paragraph or list item.

Examples:
    python dev/readme_stats.py
    python dev/readme_stats.py --readme other.md --max-words 2000
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPISODE_COMMANDS = ("scripts/pretrain.py --rope", "scripts/evaluate.py", "scripts/context.py")  # as the video types
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def prose(text: str) -> list[str]:
    """The README's paragraphs and list items, as plain text."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    paragraphs, current, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            line = ""
        if fenced or line.lstrip().startswith(("|", "#", "![")):
            line = ""
        if not line.strip() or re.match(r"\s*([-*]|\d+\.)\s", line):  # a blank line or a new item: a new paragraph
            if current:
                paragraphs.append(" ".join(current))
            current = [re.sub(r"^\s*([-*]|\d+\.)\s", "", line).strip()] if line.strip() else []
        else:
            current.append(line.strip())
    if current:
        paragraphs.append(" ".join(current))
    return [LINK.sub(r"\1", p).replace("**", "") for p in paragraphs if p.strip()]


def sentences(text: str) -> list[str]:
    return [s for p in prose(text) for s in SENTENCE_END.split(p) if s.split()]


def first_command_line(text: str) -> int | None:
    """The line of the first episode command inside a code block (1-based), or None."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced and any(c in line for c in EPISODE_COMMANDS):
            return number
    return None


def stats(text: str) -> dict:
    said = sentences(text)
    lengths = [len(s.split()) for s in said]
    return {"words": len(text.split()), "sentences": len(said), "mean_sentence": sum(lengths) / max(1, len(lengths)),
            "longest_sentence": max(lengths, default=0), "first_episode_command_line": first_command_line(text)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--readme", default=str(ROOT / "README.md"))
    p.add_argument("--max-words", type=int, default=1400)
    p.add_argument("--max-mean-sentence", type=float, default=22.0)
    p.add_argument("--max-command-line", type=int, default=60)
    args = p.parse_args(argv)
    s = stats(Path(args.readme).read_text(encoding="utf-8"))
    line = s["first_episode_command_line"]
    checks = [(f"words: {s['words']:,} (goal <= {args.max_words:,})", s["words"] <= args.max_words),
              (f"mean sentence: {s['mean_sentence']:.1f} words over {s['sentences']} sentences, the longest "
               f"{s['longest_sentence']} (goal <= {args.max_mean_sentence:g})",
               s["mean_sentence"] <= args.max_mean_sentence),
              (f"first episode command at line {line} (goal <= {args.max_command_line})",
               line is not None and line <= args.max_command_line)]
    for said, ok in checks:
        print(f"{'ok  ' if ok else 'MISS'} {said}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
