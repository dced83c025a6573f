"""A turn that generates an image and then speech, printing (and saving) the artifacts.

tool_choice makes sure the small default model calls each tool (the engine enforces it with
structured outputs); the calls themselves are real: Stable Diffusion through diffusers, speech
through Piper (offline defaults, see the README).

    .venv/bin/python examples/multimodal.py [--url http://127.0.0.1:8000] [--save-dir out/]
"""

from __future__ import annotations

from pathlib import Path

from common import connect, parser, show


def main() -> int:
    p = parser(__doc__ or "")
    p.add_argument("--save-dir", default=None)
    args = p.parse_args()
    c = connect(args)
    s = c.create_session(tools=["image", "tts"], max_tokens=64)
    urls: list[str] = []
    for message, tool in (("Draw a red fox in the snow.", "Image"), ("Now say 'hello, fox' out loud.", "TTS")):
        print(f"\nyou> {message}")
        events = list(c.stream_message(s, message, tool_choice={"name": tool}))
        show(events, args.quiet)
        for ev in events:
            if ev.name == "tool_result":
                urls += ev["artifacts"]
    print("\nartifacts:")
    for url in urls:
        data = c.artifact(url)
        line = f"  {args.url}{url}  ({len(data)} bytes)"
        if args.save_dir:
            out = Path(args.save_dir) / url.rsplit("/", 1)[1]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            line += f" -> {out}"
        print(line)
    c.close_session(s)
    c.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
