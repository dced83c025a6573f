"""The pool of generated ALFWorld tasks: written to disk the way `alfworld-generate` writes games,
checked solvable in ALFWorld's own engine, built lazily slot by slot.

    <root>/logic/alfred.pddl, alfred.twl2                    (as in $ALFWORLD_DATA)
    <root>/json_2.1.1/train/<task_type>-<Object>-None-<Parent>-<scene>/trial_<id>/initial_state.pddl
                                                                               /traj_data.json
                                                                               /game.tw-pddl

`game.tw-pddl` holds what `alfworld-generate` puts there: domain, grammar with the task sentence, problem,
`solvable` and `walkthrough`. The walkthrough is the generator's own full-knowledge plan, played in
ALFWorld's TextWorld-PDDL engine before the task is kept (a task it does not win is dropped);
`expert_walkthrough` runs ALFWorld's hand-coded expert instead (alfworld-generate's default check, slow
in big kitchens because it searches like a player).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from augmentations.alfworld_tasks import (
    TASK_TYPES,
    Receptacle,
    Scene,
    choose_task,
    fix_name,
    needs_tool,
    package_dir,
    place_objects,
    problem_pddl,
    task_sentence,
)

SPLIT_DIR = Path("json_2.1.1") / "train"
GENERATOR_VERSION = 2  # bump when generated tasks change, so cached pools are rebuilt


class _PlannerLibs:
    """Fast Downward libraries for ALFWorld games, lent out and taken back instead of unloaded.

    TextWorld's PddlEnv loads its own copy of libdownward.so (33 MB; copies because the planner keeps global
    state) and never unloads it: ~3-9 MB leaked per game. Unloading it (`fast_downward.close_lib`, dlclose)
    is worse: the library registers an `on_exit` handler and signal handlers (SIGABRT, SIGTERM, SIGINT,
    SIGSEGV, SIGXCPU) that glibc keeps after the dlclose, so the process jumped into unmapped code when it
    exited (the test suite's process segfaulted after its summary). So a game borrows a library here and
    gives it back, planner state cleared, when it closes: as many copies as games ever ran at once, each
    loaded once and never unloaded."""

    def __init__(self) -> None:
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._original: Any = None

    def install(self) -> None:
        """Make TextWorld's `fast_downward.load_lib()` borrow from here (idempotent)."""
        import fast_downward

        with self._lock:
            if self._original is None:
                self._original = fast_downward.load_lib
                fast_downward.load_lib = self.borrow

    def borrow(self) -> Any:
        with self._lock:
            if self._free:
                return self._free.pop()
        return self._original()

    def give_back(self, lib: Any) -> None:
        with self._lock:
            if any(free is lib for free in self._free):
                return  # given back already: lending one copy to two games would mix their planners
            lib.cleanup()  # the planner's task and search state; the next game's reset loads its own
            self._free.append(lib)


PLANNER_LIBS = _PlannerLibs()


def alfworld_env(expert: bool = False) -> Any:
    """ALFWorld's TextWorld-PDDL environment as alfworld-generate builds it: TextWorld's PddlEnv under
    ALFWorld's AlfredDemangler ("cabinet 3") and AlfredInfos wrappers (+ AlfredExpert for the expert)."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import (
        AlfredDemangler,
        AlfredExpert,
        AlfredExpertType,
        AlfredInfos,
    )
    from textworld.envs import PddlEnv

    PLANNER_LIBS.install()
    infos = textworld.EnvInfos(admissible_commands=True, won=True, extras=["gamefile"])
    env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
    return AlfredExpert(env, expert_type=AlfredExpertType.HANDCODED) if expert else env


def close_env(env: Any) -> None:
    """Close the environment and give its Fast Downward library back for the next game (see
    `_PlannerLibs`: never unloaded)."""
    env.close()
    PLANNER_LIBS.give_back(env.unwrapped.downward_lib)


def expert_walkthrough(game_file: Path, max_steps: int = 150) -> list[str] | None:
    """Play the game with ALFWorld's hand-coded expert (alfworld-generate's default check); its commands
    when it wins, else None. It explores like a player, so in a 50-receptacle kitchen it is slow."""
    env = alfworld_env(expert=True)
    try:
        env.load(str(game_file))
        state = env.reset()
        commands: list[str] = []
        done = False
        while not done and len(commands) < max_steps:
            command = state["extra.expert_plan"][0]
            state, _, done = env.step(command)
            commands.append(command)
        return commands if state["won"] else None
    except Exception:  # the expert raises on tasks it cannot finish (alfworld-generate counts them unsolvable)
        return None
    finally:
        close_env(env)


def planned_walkthrough(game_file: Path, task_type: str, params: dict[str, Any], scene: Scene,
                        placed: dict[str, Receptacle]) -> list[str] | None:
    """The generator knows where everything is, so it writes the short plan itself (the full-knowledge
    plan ALFRED's planner would find: fetch, treat, deliver) and checks it by playing it in ALFWorld's
    engine; the commands when they win, else None."""
    from alfworld.gen import constants as C

    env = alfworld_env()
    try:
        env.load(str(game_file))
        state = env.reset()
        # Fast Downward lower-cases PDDL names; the demangler turns them into "cabinet 3".
        names = {info.id.lower(): info.name.strip().lower() for info in state["_entity_infos"].values()}
        name = lambda thor_id: names[fix_name(thor_id).lower()]  # noqa: E731
        plan: list[str] = []
        opened: set[str] = set()
        at = [""]  # the agent's location: `go to` where it already stands is not a move the game accepts

        def go(r: Receptacle) -> None:
            if r.loc != at[0]:
                plan.append(f"go to {name(r.rid)}")
                at[0] = r.loc

        def visit(r: Receptacle) -> None:
            go(r)
            if r.rtype in C.OPENABLE_CLASS_SET and r.rid not in opened:
                plan.append(f"open {name(r.rid)}")
                opened.add(r.rid)

        targets = sorted(o for o in placed if o.split("|")[0] == params["object_target"])
        n = 2 if task_type == "pick_two_obj_and_place" else 1
        goal_recs = [r for r in scene.receptacles if r.rtype == params["parent_target"]]
        for o in targets[:n]:
            visit(placed[o])
            plan.append(f"take {name(o)} from {name(placed[o].rid)}")
            tool = needs_tool(task_type)
            if task_type == "look_at_obj_in_light":
                lamp = next(x for x in placed if x.split("|")[0] == params["toggle_target"])
                go(placed[lamp])
                plan.append(f"use {name(lamp)}")
                continue
            if tool:
                verb = task_type.split("_")[1]  # clean / heat / cool
                station = next(r for r in scene.receptacles if r.rtype == tool)
                go(station)
                plan.append(f"{verb} {name(o)} with {name(station.rid)}")
            goal = min(goal_recs, key=lambda r: name(r.rid))
            visit(goal)
            plan.append(f"move {name(o)} to {name(goal.rid)}")
        done = False
        for command in plan:
            # Every step must be one the game accepts (else it says "Nothing happens.") and none may end it early.
            if done or command not in state["admissible_commands"]:
                return None
            state, _, done = env.step(command)
        return plan if state["won"] else None
    finally:
        close_env(env)


def write_task(root: Path, index: int, task_type: str, seed: int, expert: bool = False) -> Path | None:
    """One task folder under root/json_2.1.1/train, or None when this (seed, index) gave no solvable task.
    Written to a temporary folder and renamed, so a reader never sees half a task."""
    rng = random.Random(f"{seed}:{task_type}:{index}")
    chosen = choose_task(task_type, rng)
    if chosen is None:
        return None
    scene, params = chosen
    placed = place_objects(scene, task_type, params, rng)
    task_id = f"trial_T{seed:08d}_{TASK_TYPES.index(task_type) + 1}{index:05d}"
    target = params["parent_target"] or params["toggle_target"]
    folder = root / SPLIT_DIR / f"{task_type}-{params['object_target']}-None-{target}-{scene.num}" / task_id
    if (folder / "game.tw-pddl").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{task_id}.", dir=folder.parent))
    try:
        pddl = problem_pddl(task_id, scene, task_type, params, placed, rng)
        (tmp / "initial_state.pddl").write_text(pddl)
        sentence = task_sentence(task_type, params, rng)
        traj = {
            "task_id": task_id, "task_type": task_type, "pddl_params": params,
            "scene": {"floor_plan": scene.floor_plan, "scene_num": scene.num, "random_seed": rng.getrandbits(31)},
            # ALFRED's slot for human goal sentences; the templated one here, so that mode works too.
            "turk_annotations": {"anns": [{"task_desc": sentence[0].upper() + sentence[1:] + "."}]},
        }
        (tmp / "traj_data.json").write_text(json.dumps(traj, indent=2))
        logic = root / "logic"
        game = {
            "pddl_domain": (logic / "alfred.pddl").read_text(),
            # alfworld.agents.utils.misc.add_task_to_grammar: the task sentence replaces the placeholder.
            "grammar": (logic / "alfred.twl2").read_text().replace("UNKNOWN GOAL", sentence),
            "pddl_problem": pddl, "solvable": None, "walkthrough": None,
        }
        game_file = tmp / "game.tw-pddl"
        game_file.write_text(json.dumps(game))
        walkthrough = (expert_walkthrough(game_file) if expert
                       else planned_walkthrough(game_file, task_type, params, scene, placed))
        if walkthrough is None:
            return None
        game.update(solvable=True, walkthrough=walkthrough)
        game_file.write_text(json.dumps(game))
        try:
            tmp.rename(folder)
        except OSError:  # another process finished the same task first
            pass
        return folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_logic(root: Path) -> None:
    """root/logic/alfred.pddl and alfred.twl2, copied from the wheel (where $ALFWORLD_DATA has them)."""
    (root / "logic").mkdir(parents=True, exist_ok=True)
    for name in ("alfred.pddl", "alfred.twl2"):
        if not (root / "logic" / name).is_file():
            shutil.copy(package_dir() / "data" / name, root / "logic" / name)


def ensure_task(root: Path, task_type: str, slot: int, seed: int = 0, max_tries: int = 30) -> Path:
    """The game file of pool slot (task_type, slot), built on first use. Slot k tries indices k, k+1000,
    k+2000, ... so every slot is deterministic and independent of the others."""
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; known: {', '.join(TASK_TYPES)}")
    ensure_logic(root)
    index_file = root / "pool" / f"v{GENERATOR_VERSION}-seed{seed}-{task_type}-{slot}.json"
    if index_file.is_file():
        folder = root / json.loads(index_file.read_text())["task"]
        if (folder / "game.tw-pddl").is_file():
            return folder / "game.tw-pddl"
    for attempt in range(max_tries):
        folder = write_task(root, slot + 1000 * attempt, task_type, seed)
        if folder is not None:
            index_file.parent.mkdir(parents=True, exist_ok=True)
            part = index_file.with_name(f".{index_file.name}.{os.getpid()}.{threading.get_ident()}")
            part.write_text(json.dumps({"task": str(folder.relative_to(root))}))
            os.replace(part, index_file)  # readers see the whole file or none
            return folder / "game.tw-pddl"
    raise RuntimeError(f"no solvable {task_type} task for slot {slot} of seed {seed} after {max_tries} tries")


def build_pool(root: Path, per_type: int = 2, seed: int = 0, task_types: tuple[str, ...] = TASK_TYPES) -> list[Path]:
    """All slots of the pool: `per_type` solvable tasks of each type (game files)."""
    return [ensure_task(root, t, k, seed) for t in task_types for k in range(per_type)]
