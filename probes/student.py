"""The student a probe or a calibration measures, resolved from its spec once and passed along.

    from capacity_advisor.probes.student import student_of
    s = student_of("lab:m")                 # kind "lab", the lab recipe, the ladder name "m"
    s = student_of("./qwen-1.5b", describe_config("./qwen-1.5b"))
    rate, source = s.learning_rate()        # the probe's and the full run's

Its kind picks its recipe (`probes.recipe`): `lab` for the lab's students, named (`lab:NAME`) or
handed over as the folder of a lab build (its `build.json`: the ladder name and pretraining rate),
`real` for everything else. A folder whose build.json cannot be read is a real student, and the
student carries a note saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from capacity_advisor.core.errors import InputError
from capacity_advisor.models.lab.ladder import LADDER, parse_name, read_build
from capacity_advisor.models.lab.pretrained import pretrained_name
from capacity_advisor.probes.recipe import LAB, REAL, Recipe, size_learning_rate


@dataclass(frozen=True)
class Student:
    spec: str  # what loads it: a model folder, a hub id, lab:NAME[+bBUILD][@STEPS]
    kind: str  # "lab" or "real": how it is probed
    recipe: Recipe  # its kind's recipe
    description: dict | None = None  # its config (models.loading.describe_config); None until read
    size: str | None = None  # the ladder name `lab:NAME...` names (None: not named so)
    build: dict | None = None  # {"name", "lr"} of the lab build its folder holds
    note: str | None = None  # its folder's build.json was not read: why, and what follows

    def described(self, description: dict) -> "Student":
        return replace(self, description=description)

    def learning_rate(self) -> tuple[float, str]:
        """(rate, where it comes from) of its probe and the full run it advises on: half a ladder
        student's pretraining peak; for any other model the full-fine-tuning rate SFT recipes use
        at its size (its description's parameters)."""
        if self.kind == "lab" and self.size in LADDER:
            return LADDER[self.size].lr * 0.5, "lab recipe (half the pretraining peak)"
        if self.build is not None:
            return self.build["lr"] * 0.5, "lab recipe (half the pretraining peak its build.json states)"
        return size_learning_rate(self.description["n_params"]), "size default"


def student_of(spec: str, description: dict | None = None) -> Student:
    """The student `spec` names: a lab name parsed, a folder's build.json read, once. A pretrained
    student the lab names (`lab:smollm2-135m`) is a real student."""
    if pretrained_name(spec) is not None:
        return Student(spec, "real", REAL, description)
    size = lab_size(spec)
    if size is not None:
        return Student(spec, "lab", LAB, description, size=size)

    build, why = read_build(spec)
    if build is not None:
        return Student(spec, "lab", LAB, description, build=build)
    note = None if why is None else (
        f"{spec}/build.json was not read ({why}): the folder is probed with the real students' recipe and the "
        "learning rate for its size, not as a lab build; rewrite or remove that file")
    return Student(spec, "real", REAL, description, note=note)


def lab_size(spec: str) -> str | None:
    """The ladder name of `lab:NAME[+bBUILD][@STEPS]` (the text after `lab:` when it does not parse),
    or None for any other model (a pretrained student the lab names among them)."""
    if not spec.startswith("lab:") or pretrained_name(spec) is not None:
        return None

    try:
        return parse_name(spec[len("lab:"):]).name
    except InputError:
        return spec[len("lab:"):]
