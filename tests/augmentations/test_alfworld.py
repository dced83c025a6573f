"""ALFWorld for real: tasks generated offline in ALFWorld's format, played in ALFWorld's TextWorld-PDDL
environment through the tool; official-layout data found by ALFWorld's own loader. No mocks: every
observation below comes from the engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from augmentations.alfworld import ALFWorld
from augmentations.alfworld_pool import build_pool, expert_walkthrough, write_task
from augmentations.alfworld_tasks import TASK_TYPES
from augmentations.base import CallContext, ToolError

INTRO = "-= Welcome to TextWorld, ALFRED! =- You are in the middle of a room. Looking quickly around you, you see "


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("infercept-home")


@pytest.fixture(scope="module")
def pool(home: Path) -> dict[str, Path]:
    """One task of each type (slot 0, seed 0): what ALFWorld(tasks_per_type=1) plays."""
    games = build_pool(home / "alfworld", per_type=1, seed=0)
    return {json.loads((g.parent / "traj_data.json").read_text())["task_type"]: g for g in games}


@pytest.fixture(autouse=True)
def no_official_games(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Importing alfworld sets ALFWORLD_DATA to ~/.cache/alfworld; official games there would be played
    # instead of the pool, so point it at an empty folder.
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "no-alfworld-data"))


@pytest.fixture
def tool(home: Path, pool: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> ALFWorld:
    monkeypatch.setenv("INFERCEPT_HOME", str(home))
    return ALFWorld(tasks_per_type=1)


async def session_for(tool: ALFWorld, game: Path, prefix: str = "s") -> str:
    """A session id the tool maps to `game` (sessions are assigned by a hash of their id)."""
    for i in range(500):
        if Path(await tool.game_for(f"{prefix}{i}")) == game:
            return f"{prefix}{i}"
    raise AssertionError(f"no session plays {game}")


def test_pool_is_in_alfworld_format(home: Path, pool: dict[str, Path]) -> None:
    assert sorted(pool) == sorted(TASK_TYPES)
    root = home / "alfworld"
    assert (root / "logic" / "alfred.pddl").is_file() and (root / "logic" / "alfred.twl2").is_file()
    for task_type, game in pool.items():
        folder = game.parent
        assert folder.parent.parent == root / "json_2.1.1" / "train"
        assert folder.parent.name.startswith(task_type + "-") and folder.name.startswith("trial_T")
        traj = json.loads((folder / "traj_data.json").read_text())
        assert traj["task_type"] == task_type and traj["scene"]["floor_plan"].startswith("FloorPlan")
        assert set(traj["pddl_params"]) == {"object_target", "parent_target", "mrecep_target", "toggle_target",
                                            "object_sliced"}
        problem = (folder / "initial_state.pddl").read_text()
        assert problem.lstrip().startswith(f"(define (problem plan_{folder.name})\n(:domain alfred)")
        data = json.loads(game.read_text())
        assert set(data) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
        assert data["solvable"] is True and data["pddl_problem"] == problem
        assert "UNKNOWN GOAL" not in data["grammar"]


async def test_an_expert_wins_every_task_type_through_the_tool(tool: ALFWorld, pool: dict[str, Path]) -> None:
    for task_type, game in pool.items():
        ctx = CallContext(session_id=await session_for(tool, game))
        intro = (await tool.run("", ctx)).content
        assert intro.startswith(INTRO), intro[:120]
        sentence = json.loads((game.parent / "traj_data.json").read_text())["turk_annotations"]["anns"][0]["task_desc"]
        assert f"Your task is to: {sentence[0].lower()}{sentence[1:]}" in intro
        walkthrough = json.loads(game.read_text())["walkthrough"]
        for command in walkthrough[:-1]:
            r = await tool.run(command, ctx)
            assert not r.content.startswith("Nothing happens") and "You won!" not in r.content, (command, r.content)
        last = await tool.run(walkthrough[-1], ctx)
        assert last.content.endswith("You won!"), (task_type, last.content)
        assert not tool._plays[ctx.session_id].playing  # a finished game starts again on the next call
        if task_type == "look_at_obj_in_light":  # (a small room: starting it again is cheap)
            assert (await tool.run("look", ctx)).content.startswith(INTRO)
    await tool.close()


async def test_wrong_commands_and_restart(tool: ALFWorld, pool: dict[str, Path]) -> None:
    ctx = CallContext(session_id=await session_for(tool, pool["pick_and_place_simple"]))
    first = await tool.run("fly to the moon", ctx)  # the first call is an action: intro, then the game's answer
    assert first.content.startswith(INTRO) and first.content.endswith(" Nothing happens.")
    assert (await tool.run("take the moon", ctx)).content == "Nothing happens."
    assert (await tool.run("inventory", ctx)).content == "You are not carrying anything."
    walkthrough = json.loads(pool["pick_and_place_simple"].read_text())["walkthrough"]
    await tool.run(walkthrough[0], ctx)
    took = await tool.run(walkthrough[1], ctx)
    assert took.content.startswith("You pick up the ")
    # The game lists what it accepts now (take/move/open...; not `go to`, the text names the places).
    assert "Commands (besides go to, look, inventory, examine): " in took.content
    assert (await tool.run("inventory", ctx)).content.startswith("You are carrying: a ")
    assert (await tool.run("restart", ctx)).content.startswith(INTRO)
    assert (await tool.run("inventory", ctx)).content == "You are not carrying anything."
    await tool.close()


async def test_the_move_limit_ends_a_game(home: Path, pool: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERCEPT_HOME", str(home))
    tool = ALFWorld(tasks_per_type=1, max_moves=2)
    ctx = CallContext(session_id=await session_for(tool, pool["pick_and_place_simple"]))
    await tool.run("start", ctx)
    assert (await tool.run("look", ctx)).content.startswith("You are in the middle of a room.")
    assert (await tool.run("inventory", ctx)).content == (
        "You are not carrying anything. You lost: the 2 moves are used up.")
    assert (await tool.run("inventory", ctx)).content.startswith(INTRO)  # a new game, then the move
    await tool.close()


async def test_two_sessions_have_their_own_state(tool: ALFWorld, pool: dict[str, Path]) -> None:
    game = pool["pick_two_obj_and_place"]
    a = CallContext(session_id=await session_for(tool, game))
    b = CallContext(session_id=await session_for(tool, game, prefix="t"))
    walkthrough = json.loads(game.read_text())["walkthrough"]
    take = next(i for i, c in enumerate(walkthrough) if c.startswith("take "))
    for command in walkthrough[: take + 1]:
        await tool.run(command, a)
    assert (await tool.run("inventory", a)).content.startswith("You are carrying: a ")
    assert (await tool.run("inventory", b)).content.endswith("You are not carrying anything.")
    # b can still take the very object a holds in its own game.
    for command in walkthrough[: take + 1]:
        last = await tool.run(command, b)
    assert last.content.startswith("You pick up the ")
    await tool.end_session(a.session_id)
    assert a.session_id not in tool._plays and b.session_id in tool._plays
    await tool.close()


async def test_official_layout_through_alfworlds_loader(tmp_path: Path, pool: dict[str, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """ALFWORLD_DATA pointing at games laid out as alfworld-download lays them out: AlfredTWEnv's
    collect_game_files picks the solvable games of the split and task types."""
    data = tmp_path / "alfworld-data"
    shutil.copytree(pool["pick_and_place_simple"].parents[4] / "logic", data / "logic")
    split = data / "json_2.1.1" / "valid_unseen"
    for task_type in ("pick_and_place_simple", "look_at_obj_in_light", "pick_two_obj_and_place"):
        folder = pool[task_type].parent
        shutil.copytree(folder, split / folder.parent.name / folder.name)
    unsolvable = next(split.glob("pick_two_obj_and_place-*/*/game.tw-pddl"))
    unsolvable.write_text(json.dumps({**json.loads(unsolvable.read_text()), "solvable": False}))
    monkeypatch.setenv("ALFWORLD_DATA", str(data))
    tool = ALFWorld(split="eval_out_of_distribution")
    games = {Path(await tool.game_for(f"s{i}")).parent.parent.name.split("-")[0] for i in range(40)}
    assert games == {"pick_and_place_simple", "look_at_obj_in_light"}  # the unsolvable one is skipped
    ctx = CallContext(session_id="s0")
    game = Path(await tool.game_for("s0"))
    assert split in game.parents
    assert (await tool.run("", ctx)).content.startswith(INTRO)
    for command in json.loads(game.read_text())["walkthrough"]:
        last = await tool.run(command, ctx)
    assert last.content.endswith("You won!")
    await tool.close()
    only_light = ALFWorld(data=str(data), split="eval_out_of_distribution", task_types=["look_at_obj_in_light"])
    assert "look_at_obj_in_light-" in await only_light.game_for("x")
    with pytest.raises(ToolError, match="not found: no json_2.1.1 in"):
        await ALFWorld(data=str(tmp_path / "nope")).game_for("x")
    with pytest.raises(ToolError, match="no solvable ALFWorld games"):
        await ALFWorld(data=str(data), split="train").game_for("x")  # no train split there


def test_alfworlds_handcoded_expert_solves_a_generated_task(tmp_path: Path, pool: dict[str, Path]) -> None:
    """ALFWorld's own expert (it reads traj_data.json beside the game) wins a generated task too."""
    game = pool["look_at_obj_in_light"]
    plan = expert_walkthrough(game)
    assert plan is not None and plan[-1].startswith("use desklamp")


def test_generation_is_deterministic(tmp_path: Path, pool: dict[str, Path]) -> None:
    (tmp_path / "logic").mkdir()
    shutil.copytree(pool["look_at_obj_in_light"].parents[4] / "logic", tmp_path / "logic", dirs_exist_ok=True)
    again = write_task(tmp_path, 0, "look_at_obj_in_light", 0)
    assert again is not None
    original = pool["look_at_obj_in_light"].parent
    for name in ("initial_state.pddl", "traj_data.json", "game.tw-pddl"):
        assert (again / name).read_text() == (original / name).read_text()


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="task_types"):
        ALFWorld(task_types=["juggle"])
    with pytest.raises(ValueError, match="positive"):
        ALFWorld(tasks_per_type=0)


EXIT_SCRIPT = """
import sys
from augmentations.alfworld_pool import alfworld_env, close_env

game = sys.argv[1]  # Fast Downward's translator rewrites sys.argv while it plans
libs = []
for _ in range(2):
    env = alfworld_env()
    env.load(game)
    env.reset()
    libs.append(env.unwrapped.downward_lib)
    close_env(env)
    close_env(env)  # twice: still one copy in the free list
assert libs[0] is libs[1], "the second game loaded a new Fast Downward library instead of reusing the first"
print("played", flush=True)
"""


def test_a_process_that_played_games_exits_cleanly(pool: dict[str, Path]) -> None:
    """Fast Downward registers an on_exit handler and signal handlers; once its library was unloaded after a
    game, the process segfaulted at exit (the test suite's own process did, after its summary). Games now
    borrow a library and give it back: the process exits normally, through interpreter finalization."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(pool["pick_and_place_simple"])], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert "played" in proc.stdout
