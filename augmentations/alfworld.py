"""`alfworld` (type ve): a real text-game environment per agent session.

Every call is one action sent to the game engine (TextWorld's Inform 7/Glulx runtime through
`textworld.start`); the observation the game prints comes back to the model. The game files come from,
in order: the `games` setting (any TextWorld-playable files: .z8, .ulx, or ALFWorld games exported to
them), else a small pool the project generates offline with TextWorld's own generator (seeded, cached
under `$INFERCEPT_HOME/games`). ALFWorld's official games are download-only (see NOTES.md), so they
are used when a user points `games` at them.

Special arguments: an empty argument or `start` shows the current game's intro and goal; `restart`
starts a new game. A won or lost game says so and restarts on the next call.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from augmentations.base import CallContext, ToolError, ToolResult


def games_home() -> Path:
    return Path(os.environ.get("INFERCEPT_HOME", Path.home() / ".cache" / "infercept")) / "games"


def generate_games(out_dir: Path, count: int, seed: int = 0) -> list[Path]:
    """Build `count` small TextWorld games (2 rooms, a 2-step quest) once; idempotent."""
    import textworld
    from textworld.generator import compile_game, make_game

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = out_dir / f"tw-{seed + i}.z8"
        if not path.is_file():
            opts = textworld.GameOptions()
            opts.seeds = seed + i
            opts.nb_rooms = 2
            opts.nb_objects = 4
            opts.quest_length = 2
            opts.path = str(path)
            opts.force_recompile = True
            opts.file_ext = ".z8"
            compile_game(make_game(opts), opts)
        paths.append(path)
    return paths


@dataclass
class _Play:
    game: Path
    env: Any = None
    moves: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class TextGame:
    name = "ALFWorld"
    aug_type = "ve"
    description = "act in a text-based household environment; the argument is one command such as 'go north' or 'take apple'"

    def __init__(self, games: Sequence[str] = (), generated: int = 4, seed: int = 0, max_moves: int = 100,
                 show_commands: bool = True) -> None:
        self._games_setting = [Path(g) for g in games]
        self._generated, self._seed, self.max_moves = generated, seed, max_moves
        # List the commands the game accepts after each observation (TextWorld's admissible commands):
        # small models need it to act sensibly; set False for the harder, paper-style setting.
        self.show_commands = show_commands
        self._games: list[Path] | None = None
        self._plays: dict[str, _Play] = {}
        self._init_lock = asyncio.Lock()

    async def _game_list(self) -> list[Path]:
        async with self._init_lock:
            if self._games is None:
                if self._games_setting:
                    missing = [str(g) for g in self._games_setting if not g.is_file()]
                    if missing:
                        raise ToolError(f"game files not found: {', '.join(missing)}")
                    self._games = list(self._games_setting)
                else:
                    self._games = await asyncio.to_thread(generate_games, games_home(), self._generated, self._seed)
            return self._games

    async def _play(self, session_id: str) -> _Play:
        play = self._plays.get(session_id)
        if play is None:
            games = await self._game_list()
            # A session always gets the same game: reproducible traces.
            idx = int(hashlib.sha1(session_id.encode()).hexdigest(), 16) % len(games)
            play = self._plays[session_id] = _Play(games[idx])
        return play

    @staticmethod
    def _start(game: Path) -> tuple[Any, Any]:
        import textworld

        infos = textworld.EnvInfos(objective=True, admissible_commands=True, won=True, lost=True, score=True, max_score=True)
        env = textworld.start(str(game), request_infos=infos)
        return env, env.reset()

    def _format(self, state: Any, intro: bool) -> str:
        text = (state.feedback or "").strip()
        if intro:
            # The game's banner is ASCII art; the model needs the prose after it.
            text = text.split("$$$$$$$", 1)[-1].split("\n\n", 1)[-1].strip() if "$$$" in text else text
        text = " ".join(text.split())
        if state.get("won"):
            text += f" You won the game (score {state.get('score')}/{state.get('max_score')})."
        elif state.get("lost"):
            text += " You lost the game."
        elif self.show_commands and state.get("admissible_commands"):
            cmds = [c for c in state["admissible_commands"] if c not in ("look", "inventory") and not c.startswith("examine")]
            text += " Commands: " + ", ".join(cmds) + "."
        return text

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        command = " ".join(args.strip().strip("'\"").split()).lower()
        play = await self._play(ctx.session_id or "default")
        async with play.lock:
            if play.env is None or command == "restart":
                if play.env is not None:
                    await asyncio.to_thread(play.env.close)
                play.env, state = await asyncio.to_thread(self._start, play.game)
                play.moves = 0
                intro = self._format(state, intro=True)
                if command in ("", "start", "restart", "look"):
                    return ToolResult(intro)
                # The first call is already an action: show the intro, then play it.
                return ToolResult(intro + " " + await self._step(play, command))
            if command in ("", "start"):
                command = "look"
            return ToolResult(await self._step(play, command))

    async def _step(self, play: _Play, command: str) -> str:
        if play.moves >= self.max_moves:
            raise ToolError(f"move limit of {self.max_moves} reached; call restart")
        state, _score, done = await asyncio.to_thread(play.env.step, command)
        play.moves += 1
        text = self._format(state, intro=False)
        if done:
            await asyncio.to_thread(play.env.close)
            play.env = None
        return text or "Nothing happens."

    async def end_session(self, session_id: str) -> None:
        play = self._plays.pop(session_id, None)
        if play is not None and play.env is not None:
            await asyncio.to_thread(play.env.close)

    async def close(self) -> None:
        for sid in list(self._plays):
            await self.end_session(sid)
