#!/usr/bin/env python3
"""Turns a play in tinyshakespeare's layout (speeches of "NAME:" followed by its lines, separated
by blank lines) into prompt/response records for fine-tuning, one JSON object per line:

    {"prompt": "<the speech before>\\n\\nROMEO:\\n", "response": "<ROMEO's speech>\\n"}

so that prepare_data --loss-on response trains a model to answer as one speaker (or as whoever
speaks next, with --speaker ALL). Standard library only.

    scripts/make_dialogue_jsonl.py data/tinyshakespeare.txt --speaker ROMEO --out data/romeo.jsonl
"""
import argparse
import json
import re
import sys

SPEAKER_LINE = re.compile(r"^([A-Z][A-Za-z' ]*[A-Za-z]):$")


def speeches(text):
    """(speaker, lines of the speech) in order; blocks that do not start with a speaker are skipped."""
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").split("\n")
        match = SPEAKER_LINE.match(lines[0]) if lines else None
        if match and len(lines) > 1:
            yield match.group(1), lines[1:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("play", help="the text, e.g. data/tinyshakespeare.txt")
    parser.add_argument("--speaker", default="ROMEO",
                        help="whose speeches are the responses (default ROMEO; ALL: every speech)")
    parser.add_argument("--out", default="-", help="the JSONL file to write (default: stdout)")
    args = parser.parse_args()

    try:
        with open(args.play, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"make_dialogue_jsonl.py: {args.play}: {e.strerror}")

    records = []
    previous = None
    for speaker, lines in speeches(text):
        if previous is not None and args.speaker in ("ALL", speaker):
            prev_speaker, prev_lines = previous
            prompt = f"{prev_speaker}:\n" + "\n".join(prev_lines) + f"\n\n{speaker}:\n"
            records.append({"prompt": prompt, "response": "\n".join(lines) + "\n"})
        previous = (speaker, lines)
    if not records:
        sys.exit(f"make_dialogue_jsonl.py: --speaker {args.speaker}: no speech of theirs follows "
                 f"another in {args.play}")

    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8")
    with out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"make_dialogue_jsonl.py: {len(records)} records ({args.speaker}) -> {args.out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
