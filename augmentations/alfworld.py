"""`alfworld` (type ve): ALFWorld's household tasks, one game per agent session.

Each call is one command played in ALFWorld's TextWorld-PDDL environment (TextWorld's `PddlEnv` on the
game's `game.tw-pddl` under ALFWorld's `AlfredDemangler` and `AlfredInfos` wrappers, the stack
`AlfredTWEnv` and `alfworld-generate` use); the model reads ALFWorld's own text: "You are in the middle
of a room. Looking quickly around you, you see ...", "Nothing happens." for a command the game does not
accept, and, when the task is done, "You won!" (what `alfworld-play-tw` prints).

The games come from, in order:
* `data`, else `$ALFWORLD_DATA` (ALFWorld's own default: ~/.cache/alfworld) when it holds `json_2.1.1`:
  ALFWorld's official games as `alfworld-download` lays them out; `AlfredTWEnv.collect_game_files` picks
  the solvable ones of the `split` and task types. (Importing `alfworld` sets ALFWORLD_DATA to its
  default and creates that folder, so the variable alone does not mean games were downloaded.)
* otherwise a pool of tasks of the six types generated offline from the room layouts the `alfworld`
  wheel ships (augmentations/alfworld_tasks.py), in the same format, cached under
  `$INFERCEPT_HOME/alfworld`, each task built the first time a session needs it.

A session always gets the same game (by a hash of its id): reproducible traces. Special arguments: an
empty argument or `start` shows the intro; `restart` starts the game over. A won or lost game says so
and starts again on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from augmentations.alfworld_pool import alfworld_env, close_env, ensure_task
from augmentations.alfworld_tasks import TASK_TYPES
from augmentations.base import CallContext, ToolError, ToolResult
from engine_adapter.paths import infercept_home

_QUIET = {"look", "inventory", "help"}


def pool_home() -> Path:
    return infercept_home() / "alfworld"


def official_data(setting: Path | None) -> Path | None:
    """The ALFWorld data folder to play, or None for the generated pool."""
    if setting is not None:
        if not (setting / "json_2.1.1").is_dir():
            raise ToolError(f"ALFWorld data folder not found: no json_2.1.1 in {setting}")
        return setting
    path = Path(os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld").expanduser()
    return path if (path / "json_2.1.1").is_dir() else None


def official_games(data: Path, split: str, task_types: Sequence[str]) -> list[str]:
    """Game files of an ALFWorld data folder, found by ALFWorld's own loader (solvable ones only)."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    split_dir = {"train": "train", "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}
    if split not in split_dir:
        raise ValueError(f"alfworld split must be one of {', '.join(split_dir)}, not {split!r}")
    path = str(data / "json_2.1.1" / split_dir[split])
    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [TASK_TYPES.index(t) + 1 for t in task_types]},
        "dataset": {"data_path": path, "eval_id_data_path": path, "eval_ood_data_path": path,
                    "num_train_games": -1, "num_eval_games": -1},
    }
    with contextlib.redirect_stdout(io.StringIO()):  # it prints counts; the server log is not its console
        env = AlfredTWEnv(config, train_eval=split)
    return sorted(env.game_files)


@dataclass
class _Play:
    game: str
    env: Any = None  # loaded once per session; a restart resets it
    playing: bool = False  # False before the first call and after the game ended
    moves: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ALFWorld:
    name = "ALFWorld"
    aug_type = "ve"
    description = ("act in a household (ALFWorld); the argument is one command such as 'go to fridge 1', "
                   "'take apple 1 from countertop 2' or 'heat apple 1 with microwave 1'")

    def __init__(self, data: str | None = None, split: str = "train", task_types: Sequence[str] = TASK_TYPES,
                 tasks_per_type: int = 2, seed: int = 0, max_moves: int = 50, show_commands: bool = True) -> None:
        unknown = [t for t in task_types if t not in TASK_TYPES]
        if unknown or not task_types:
            raise ValueError(f"alfworld task_types must be among {', '.join(TASK_TYPES)}; got {list(task_types)}")
        if tasks_per_type < 1 or max_moves < 1:
            raise ValueError("alfworld tasks_per_type and max_moves must be positive")
        self.data = Path(data).expanduser() if data else None
        self.split, self.task_types = split, tuple(task_types)
        self.tasks_per_type, self.seed, self.max_moves = tasks_per_type, seed, max_moves
        # Add the commands the game accepts (its admissible commands) after each observation: small models
        # need them. `go to`, look, inventory and examine are left out: the text names every place already.
        self.show_commands = show_commands
        self._official: list[str] | None = None
        self._plays: dict[str, _Play] = {}
        self._locks: dict[Any, asyncio.Lock] = {}

    def _lock(self, key: Any) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def game_for(self, session_id: str) -> str:
        """The game file a session plays (built first if it comes from the generated pool)."""
        h = int(hashlib.sha1(session_id.encode()).hexdigest(), 16)
        async with self._lock("official"):
            if self._official is None:
                data = official_data(self.data)
                self._official = [] if data is None else await asyncio.to_thread(
                    official_games, data, self.split, self.task_types)
                if data is not None and not self._official:
                    self._official = None
                    raise ToolError(f"no solvable ALFWorld games of the chosen types in {data} ({self.split})")
        if self._official:
            return self._official[h % len(self._official)]
        n = len(self.task_types)
        slot = h % (n * self.tasks_per_type)
        key = (self.task_types[slot % n], slot // n)
        async with self._lock(key):
            return str(await asyncio.to_thread(ensure_task, pool_home(), key[0], key[1], self.seed))

    async def _play(self, session_id: str) -> _Play:
        play = self._plays.get(session_id)
        if play is None:
            game = await self.game_for(session_id)
            play = self._plays.setdefault(session_id, _Play(game))  # a concurrent first call may have won
        return play

    @staticmethod
    def _start(play: _Play) -> Any:
        if play.env is None:
            env = alfworld_env()
            try:
                env.load(play.game)
            except Exception:
                close_env(env)
                raise
            play.env = env
        play.playing, play.moves = True, 0
        return play.env.reset()

    def _format(self, state: Any, done: bool) -> str:
        text = " ".join((state.feedback or "").split())
        if state["won"]:
            return text + " You won!"
        if done:
            return text + f" You lost: the {self.max_moves} moves are used up."
        if self.show_commands:
            cmds = [c for c in state["admissible_commands"] or []
                    if c not in _QUIET and not c.startswith(("go to ", "examine "))]
            if cmds:
                text += " Commands (besides go to, look, inventory, examine): " + ", ".join(cmds) + "."
        return text

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        command = " ".join(args.strip().strip("'\"").split()).lower()
        play = await self._play(ctx.session_id or "default")
        async with play.lock:
            if not play.playing or command == "restart":
                intro = self._format(await asyncio.to_thread(self._start, play), done=False)
                if command in ("", "start", "restart"):
                    return ToolResult(intro)
                # The first call is already an action: show the intro, then play it.
                return ToolResult(intro + " " + await self._step(play, command))
            return ToolResult(await self._step(play, "look" if command in ("", "start") else command))

    async def _step(self, play: _Play, command: str) -> str:
        state, _score, ended = await asyncio.to_thread(play.env.step, command)
        play.moves += 1
        done = ended or play.moves >= self.max_moves
        if done:
            play.playing = False  # the next call starts the game again
        return self._format(state, done)

    async def end_session(self, session_id: str) -> None:
        play = self._plays.pop(session_id, None)
        if play is not None and play.env is not None:
            async with play.lock:
                await asyncio.to_thread(close_env, play.env)
                play.env = None

    async def close(self) -> None:
        for sid in list(self._plays):
            await self.end_session(sid)

