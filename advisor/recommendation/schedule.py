"""An advised option (high, low, mixed, mixed@SHARE, curriculum@EPOCHS) parsed once.

    s = Schedule.parse("curriculum@2")    # strategy "curriculum", mix 0.0, switch_epoch 2.0
    s, why = s.within(budget=1.5)          # the switch never comes within 1.5 epochs: D_high
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity_advisor.training.manifest import schedule_of


@dataclass(frozen=True)
class Schedule:
    option: str  # the predictor's name for it
    strategy: str  # high | low | mixed | curriculum: what `advisor select` and the manifest call it
    mix: float  # mixed: the share of problems on their low response
    switch_epoch: float | None  # curriculum: the epoch at which training moves from D_high to D_low

    @classmethod
    def parse(cls, option: str) -> "Schedule":
        strategy, mix, switch = schedule_of(option)
        return cls(option, strategy, mix, switch)

    def within(self, budget: float) -> tuple["Schedule", str | None]:
        """The schedule a run of `budget` epochs trains: a curriculum whose switch comes after the
        budget is D_high throughout (and the reason, said); any other schedule as it is."""
        if self.strategy == "curriculum" and self.switch_epoch is not None and self.switch_epoch >= budget:
            return Schedule.parse("high"), (f"{self.option} switches after the {budget:g}-epoch budget: "
                                            "within it, it trains on D_high")
        return self, None

    def describe(self) -> str:
        """The schedule in words, for the report's headline ("" for plain high and low)."""
        if self.strategy == "mixed":
            return f"a share {self.mix:g} of problems on their low response"
        if self.strategy == "curriculum":
            return f"D_high for {self.switch_epoch:g} epochs, then D_low"
        return ""

    def select_flags(self) -> str:
        """The `advisor select` flags that build this schedule's set."""
        if self.strategy == "mixed":
            return f"--strategy mixed --mix {self.mix:g}"
        if self.strategy == "curriculum":
            return f"--strategy curriculum --switch-epoch {self.switch_epoch:g}"
        return f"--strategy {self.strategy}"
