"""Build ALFWorld household tasks offline, in ALFWorld's own on-disk format.

ALFWorld's official games (`alfworld-download`) need the network. What its wheel does ship is enough to
write new ones the same way ALFRED wrote its `initial_state.pddl` files: the PDDL domain and TextWorld
grammar (`alfworld/data/alfred.pddl`, `alfred.twl2`), the goal templates (`alfworld.gen.goal_library`),
the object/receptacle tables (`alfworld.gen.constants`: what can hold what, what can be heated, cleaned,
cooled, toggled) and the AI2-THOR room layouts (`gen/layouts/FloorPlan*-objects.json` = the classes in
a room, `-openable.json` = its receptacles with the pose the agent stands at, `-layout.npy` = the
navigable grid). From a seeded rng this module picks a room that can host a task of one of the six
types, the task's objects (pddl_params, as in ALFRED's traj_data.json), a placement of every pickupable
object class of the room in receptacles that can hold it, and writes the PDDL problem in the shape
ALFRED's generator gave `initial_state.pddl` (mangled THOR ids, class constants, the same facts, the goal
from the goal library). augmentations/alfworld_pool.py writes the files and checks them in the engine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# Which rooms each task type uses (alfworld.gen.constants.GOALS_VALID) and the appliance it needs.
_TOOL = {"pick_clean_then_place_in_recep": "SinkBasin", "pick_heat_then_place_in_recep": "Microwave",
         "pick_cool_then_place_in_recep": "Fridge", "look_at_obj_in_light": "DeskLamp"}
_ACTION_SET = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
               "pick_cool_then_place_in_recep": "Coolable"}
# Where a desk lamp stands. THOR decides this physically, so the constants table has no entry for lamps;
# these are the receptacles official look-at-in-light tasks put one on.
LAMP_HOSTS = ("SideTable", "Desk", "Dresser", "CoffeeTable", "DiningTable")


def needs_tool(task_type: str) -> str | None:
    """The appliance a task type uses (SinkBasin, Microwave, Fridge, DeskLamp), if any."""
    return _TOOL.get(task_type)


def package_dir() -> Path:
    import alfworld

    return Path(alfworld.__file__).parent


def fix_name(name: str) -> str:
    """ALFRED's PDDL name mangling (PlannedGameState.fix_pddl_str_chars)."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        name = name.replace(a, b)
    return name


def _coord(v: float) -> str:
    return f"{v:+06.2f}"  # THOR's object-id style: +01.25, -00.50


@dataclass
class Receptacle:
    rid: str  # THOR object id, e.g. "Cabinet|+00.68|+00.50|-02.20" or "Sink|...|SinkBasin"
    rtype: str
    loc: str  # "loc|x|z|rotation|horizon" (grid units), the pose the agent stands at


@dataclass
class Scene:
    floor_plan: str
    num: int
    receptacles: list[Receptacle]
    classes: set[str]  # object classes present in the room
    free_points: list[tuple[float, float]]


def load_scene(num: int, rng: random.Random) -> Scene:
    import numpy as np
    from alfworld.gen import constants as C

    layouts = package_dir() / "gen" / "layouts"
    name = f"FloorPlan{num}"
    classes = set(json.loads((layouts / f"{name}-objects.json").read_text()))
    poses = json.loads((layouts / f"{name}-openable.json").read_text())
    points = [(float(x), float(z)) for x, z in np.load(layouts / f"{name}-layout.npy")]
    recs = []
    for rid, (x, z, rot, hor) in sorted(poses.items()):
        parts = rid.split("|")
        rtype = parts[4] if len(parts) > 4 else parts[0]
        recs.append(Receptacle(rid, rtype, f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{int(rot) // 90 % 4}|{int(hor)}"))
    # Receptacles the room has but the pose table leaves out (stove burners, toasters, coffee machines...):
    # one each, standing at a seeded navigable point.
    static = C.RECEPTACLES - C.MOVABLE_RECEPTACLES_SET
    have = {r.rtype for r in recs}
    for rtype in sorted((classes & static) - have):
        x, z = rng.choice(points)
        rid = f"{rtype}|{_coord(x)}|{_coord(0.9)}|{_coord(z)}"
        recs.append(Receptacle(rid, rtype, f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{rng.randrange(4)}|30"))
    used = {(r.loc.split("|")[1], r.loc.split("|")[2]) for r in recs}
    free = [p for p in points if (str(round(p[0] / 0.25)), str(round(p[1] / 0.25))) not in used]
    return Scene(name, num, recs, classes, free or points)


def _pickupable() -> set[str]:
    from alfworld.gen import constants as C

    static = C.RECEPTACLES - C.MOVABLE_RECEPTACLES_SET
    held = set().union(*C.VAL_RECEPTACLE_OBJECTS.values())
    lamps = C.VAL_ACTION_OBJECTS["Toggleable"]
    return {o for o in held if o not in static and o not in lamps and not o.endswith("Sliced")}


def _rooms(task_type: str) -> list[int]:
    from alfworld.gen import constants as C

    return sorted(n for room in C.GOALS_VALID[task_type] for n in C.SCENE_TYPE[room])


def choose_task(task_type: str, rng: random.Random, tries: int = 200) -> tuple[Scene, dict[str, Any]] | None:
    """A room and pddl_params for `task_type` that the room can host (appliance present, parent can hold it)."""
    from alfworld.gen import constants as C

    pick = _pickupable()
    for _ in range(tries):
        scene = load_scene(rng.choice(_rooms(task_type)), rng)
        rtypes = {r.rtype for r in scene.receptacles}
        tool = _TOOL.get(task_type)
        if tool and tool not in (rtypes | scene.classes):
            continue
        objs = sorted(scene.classes & pick)
        if task_type in _ACTION_SET:
            objs = [o for o in objs if o in C.VAL_ACTION_OBJECTS[_ACTION_SET[task_type]]]
        if not objs:
            continue
        obj = rng.choice(objs)
        params = {"object_target": obj, "parent_target": "", "mrecep_target": "", "toggle_target": "",
                  "object_sliced": False}
        if task_type == "look_at_obj_in_light":
            # The lamp must stand in a receptacle that can hold it (ToggleObject needs inReceptacle).
            if not rtypes & set(LAMP_HOSTS):
                continue
            params["toggle_target"] = "DeskLamp"
        else:
            parents = sorted(t for t in rtypes if obj in C.VAL_RECEPTACLE_OBJECTS.get(t, ()) and t != tool)
            # Another receptacle must be able to hold the object, so it can start somewhere else.
            if not parents or len([t for t in rtypes if obj in C.VAL_RECEPTACLE_OBJECTS.get(t, ())]) < 2:
                continue
            params["parent_target"] = rng.choice(parents)
        return scene, params
    return None


def place_objects(scene: Scene, task_type: str, params: dict[str, Any], rng: random.Random) -> dict[str, Receptacle]:
    """object id -> the receptacle it starts in: every pickupable class of the room, 1-2 of each (the
    target 2-3 for pick-two), never a target already in the goal receptacle type."""
    from alfworld.gen import constants as C

    holds = C.VAL_RECEPTACLE_OBJECTS
    placed: dict[str, Receptacle] = {}
    target, parent = params["object_target"], params["parent_target"]
    classes = sorted(scene.classes & _pickupable())
    if params["toggle_target"]:
        classes.append(params["toggle_target"])
    for cls in classes:
        if cls == params["toggle_target"]:
            n = 1
        elif cls == target and task_type == "pick_two_obj_and_place":
            n = rng.randint(2, 3)
        else:
            n = rng.randint(1, 2)
        spots = [r for r in scene.receptacles if cls in holds.get(r.rtype, ())
                 or (cls == params["toggle_target"] and r.rtype in LAMP_HOSTS)]
        if cls == target:
            spots = [r for r in spots if r.rtype != parent]
        if not spots:
            continue
        for _ in range(n):
            r = rng.choice(spots)
            x, y, z = (float(v) for v in r.rid.split("|")[1:4])
            dx, dz = rng.uniform(-0.3, 0.3), rng.uniform(-0.3, 0.3)
            oid = "|".join([cls, _coord(x + dx), _coord(y + 0.05), _coord(z + dz)])
            if oid not in placed:
                placed[oid] = r
    return placed


def problem_pddl(task_id: str, scene: Scene, task_type: str, params: dict[str, Any], placed: dict[str, Receptacle],
                 rng: random.Random) -> str:
    """The PDDL problem in the shape ALFRED's generator wrote (PlannedGameState.state_to_pddl + the full-
    knowledge extra facts): class constants, typed instances, locations, init facts, goal from the
    goal library."""
    from alfworld.gen import constants as C
    from alfworld.gen import goal_library as glib

    receptacle_types = sorted(C.RECEPTACLES - C.MOVABLE_RECEPTACLES_SET)
    classes = sorted(C.OBJECTS_SET - set(receptacle_types))
    cls_of = {oid: oid.split("|")[0] for oid in placed}
    x, z = rng.choice(scene.free_points)
    agent_loc = f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{rng.randrange(4)}|30"
    locs = sorted({r.loc for r in scene.receptacles} | {agent_loc})
    ind = "\n        "
    objects = (ind.join(f"{c} - object" for c in classes) + "\n" + ind.join(f"{c}Type - otype" for c in classes)
               + "\n" + ind.join(f"{t}Type - rtype" for t in receptacle_types) + "\n\n"
               + ind + ind.join(f"{fix_name(o)} - object" for o in sorted(placed))
               + ind + ind.join(f"{fix_name(r.rid)} - receptacle" for r in scene.receptacles)
               + ind + ind.join(f"{fix_name(loc)} - location" for loc in locs))
    acts = C.VAL_ACTION_OBJECTS
    facts = [f"(receptacleType {fix_name(r.rid)} {r.rtype}Type)" for r in scene.receptacles]
    facts += [f"(objectType {fix_name(o)} {cls_of[o]}Type)" for o in sorted(placed)]
    present = {r.rtype for r in scene.receptacles}
    kinds = set(cls_of.values())
    facts += [f"(canContain {t}Type {o}Type)" for t in sorted(present)
              for o in sorted(C.VAL_RECEPTACLE_OBJECTS.get(t, ())) if o in kinds]
    for o in sorted(placed):
        c = cls_of[o]
        if c in _pickupable():
            facts.append(f"(pickupable {fix_name(o)})")
        if c in C.MOVABLE_RECEPTACLES_SET:
            facts.append(f"(isReceptacleObject {fix_name(o)})")
        for flag, key in (("cleanable", "Cleanable"), ("heatable", "Heatable"), ("coolable", "Coolable"),
                          ("toggleable", "Toggleable"), ("sliceable", "Sliceable")):
            if c in acts[key]:
                facts.append(f"({flag} {fix_name(o)})")
    facts += [f"(openable {fix_name(r.rid)})" for r in scene.receptacles if r.rtype in C.OPENABLE_CLASS_SET]
    facts.append(f"(atLocation agent1 {fix_name(agent_loc)})")
    facts += [f"(inReceptacle {fix_name(o)} {fix_name(r.rid)})" for o, r in sorted(placed.items())]
    facts += [f"(receptacleAtLocation {fix_name(r.rid)} {fix_name(r.loc)})" for r in scene.receptacles]
    facts += [f"(objectAtLocation {fix_name(o)} {fix_name(r.loc)})" for o, r in sorted(placed.items())]
    goal = glib.gdict[task_type]["pddl"].format(
        obj=params["object_target"], recep=params["parent_target"], toggle=params["toggle_target"],
        mrecep=params["mrecep_target"]).replace("#", "-")
    return (f"\n(define (problem plan_{task_id})\n(:domain alfred)\n(:objects\nagent1 - agent\n{objects}\n        )\n\n"
            f"(:init\n{ind}{ind.join(facts)}\n        )\n\n{goal}")


def task_sentence(task_type: str, params: dict[str, Any], rng: random.Random) -> str:
    """alfworld.agents.utils.misc.get_templated_task_desc, with our seeded rng (it uses the global one)."""
    from alfworld.gen import goal_library as glib

    template = rng.choice(glib.gdict[task_type]["templates"])
    return template.format(obj=params["object_target"].lower(), recep=params["parent_target"].lower(),
                           toggle=params["toggle_target"].lower(), mrecep=params["mrecep_target"].lower())
