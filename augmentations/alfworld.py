"""`alfworld` (type ve): ALFWorld's household tasks, one game per agent session.

Each call is one command played in ALFWorld's TextWorld-PDDL environment, built as `AlfredTWEnv`
builds it (`textworld.gym` over the game's `game.tw-pddl`, with ALFWorld's `AlfredDemangler` and
`AlfredInfos` wrappers); the model reads ALFWorld's own text: "You are in the middle of a room. Looking
quickly around you, you see ...", "Nothing happens." for a command the game does not accept, and, when
the task is done, "You won!" (what `alfworld-play-tw` prints).

The games come from, in order:
* `data` (or the `ALFWORLD_DATA` environment variable): ALFWorld's official games as `alfworld-download`
  lays them out; `AlfredTWEnv.collect_game_files` picks the solvable ones of the `split` and task types.
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

from augmentations.alfworld_pool import ensure_task
from augmentations.alfworld_tasks import TASK_TYPES
from augmentations.base import CallContext, ToolError, ToolResult

_QUIET = {"look", "inventory", "help"}


def pool_home() -> Path:
    return Path(os.environ.get("INFERCEPT_HOME", Path.home() / ".cache" / "infercept")) / "alfworld"


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
    env: Any = None
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
        data = data or os.environ.get("ALFWORLD_DATA") or None
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
        if self.data is not None:
            async with self._lock("official"):
                if self._official is None:
                    if not self.data.is_dir():
                        raise ToolError(f"ALFWorld data folder not found: {self.data}")
                    self._official = await asyncio.to_thread(official_games, self.data, self.split, self.task_types)
                if not self._official:
                    raise ToolError(f"no solvable ALFWorld games of the chosen types in {self.data} ({self.split})")
            return self._official[h % len(self._official)]
        n = len(self.task_types)
        slot = h % (n * self.tasks_per_type)
        key = (self.task_types[slot % n], slot // n)
        async with self._lock(key):
            return str(await asyncio.to_thread(ensure_task, pool_home(), key[0], key[1], self.seed))

    async def _play(self, session_id: str) -> _Play:
        play = self._plays.get(session_id)
        if play is None:
            play = self._plays[session_id] = _Play(await self.game_for(session_id))
        return play

    def _start(self, game: str) -> tuple[Any, str, dict[str, Any]]:
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
        env_id = textworld.gym.register_game(
            game, infos, max_episode_steps=self.max_moves, wrappers=[AlfredDemangler(shuffle=False), AlfredInfos],
            name="infercept-" + hashlib.sha1(game.encode()).hexdigest()[:12])
        env = textworld.gym.make(env_id)
        obs, info = env.reset()
        return env, obs, info

    def _format(self, obs: str, info: dict[str, Any], done: bool) -> str:
        text = " ".join(obs.split())
        if info.get("won"):
            return text + " You won!"
        if done:
            return text + f" You lost: the {self.max_moves} moves are used up."
        if self.show_commands:
            cmds = [c for c in info.get("admissible_commands") or []
                    if c not in _QUIET and not c.startswith(("go to ", "examine "))]
            if cmds:
                text += " Commands (besides go to, look, inventory, examine): " + ", ".join(cmds) + "."
        return text

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        command = " ".join(args.strip().strip("'\"").split()).lower()
        play = await self._play(ctx.session_id or "default")
        async with play.lock:
            if play.env is None or command == "restart":
                if play.env is not None:
                    await asyncio.to_thread(play.env.close)
                    play.env = None
                play.env, obs, info = await asyncio.to_thread(self._start, play.game)
                intro = self._format(obs, info, done=False)
                if command in ("", "start", "restart"):
                    return ToolResult(intro)
                # The first call is already an action: show the intro, then play it.
                return ToolResult(intro + " " + await self._step(play, command))
            return ToolResult(await self._step(play, "look" if command in ("", "start") else command))

    async def _step(self, play: _Play, command: str) -> str:
        obs, _score, done, info = await asyncio.to_thread(play.env.step, command)
        text = self._format(obs, info, done)
        if done:
            await asyncio.to_thread(play.env.close)
            play.env = None
        return text

    async def end_session(self, session_id: str) -> None:
        play = self._plays.pop(session_id, None)
        if play is not None and play.env is not None:
            await asyncio.to_thread(play.env.close)

    async def close(self) -> None:
        for sid in list(self._plays):
            await self.end_session(sid)


TextGame = ALFWorld  # the factory's name for this executor
