"""`search()`: the cheapest dtype per layer under an accuracy budget, with an Optuna study.

Each trial proposes a plan (one dtype per layer or per group of layers; a container the
plan does not name gets the dtype its compute sub-layers share, if they share one, as a
Keras global policy would) and runs it at rising fidelity, cheapest first:

1. profile feasibility: float16 is never proposed for a layer whose ranges do not fit it,
   and dtypes that do not run fast on the target hardware are left out;
2. numerical proxy: loss and gradients on a few calibration batches, from the same
   weights, against float32; hopeless plans are pruned (`trial.report` + `TrialPruned`);
   TensorFlow only, skipped on JAX;
3. short training: S steps from the same checkpoint on the same batches, then the budget
   metric on validation data. Only plans that pass this level can be returned.

Between the first two levels the output rounding floor is checked: a plan whose 16-bit
outputs leave a floor on the budget metric that no training removes (measured on the
validation data, judged against half the budget's allowance at a converged float32
reference) is refused untrained, with an `output_floor` constraint above 0.

The objective is the step time of the plan from the cost model (measured on this device
for `hardware="local"`, predicted from a hardware profile otherwise), with activation
memory as a tie-break; the budget is an Optuna constraint (`trial.set_constraint`, read
by the seeded `TPESampler`).

The first trials are float32, each uniform 16-bit plan and the heuristic's per-layer
plan, evaluated layer by layer whatever the grouping; then neighbours of the best plan
(one group flipped) alternate with TPE. An assignment already trained is reused. After
the trials, the finalists are evaluated against the budget too: Keras' own global
policies as Keras applies them (containers included) and the best plan with each default
float32 protection the profile shows unneeded dropped. Where steps are timed here, every
plan within budget is timed in the same interleaved rounds and the fastest is kept only
when it is ahead of every other beyond the rounds' own noise, a tie going to the simpler
plan (`autoprec._core.rounds`, the rule the one-liner shares). The float32 reference
must beat a trivial baseline (training is lengthened until it does), and the chosen plan
is confirmed with longer training when the decision was close or the fidelity low.
`plan.metadata["search"]` records the `measurement`, the `finalists` and the
`output_floor`.

Modules: `budget` (`Budget`), `settings` (`SearchSettings`), `space` (compute layers,
groups, allowed dtypes, float16 feasibility, plans from assignments with their
containers' dtypes), `floor` (the output rounding floor and its rule), `heuristic`
(`heuristic_plan`), `departures` (the heuristic's moves off the uniform start, with
their evidence), `plan_costs` (`PlanCosts`), `losses` (what the loss says of the outputs), `evaluator` (proxy and short training), `fidelity` (trivial
baseline, lengthened training, confirmation reasons), `record` (`TrialRecord`: what a
trial keeps in its `user_attrs`), `storage` (storages and study locks), `study` (opening
the study, its pruner, reading its trials), `warm_start` (the plans every study starts
with), `same_assignment` (an assignment trained once across processes), `context`
(`SearchContext`), `objective` (the trial objective), `plan_writer` (the best plan so
far on disk), `explore` (neighbour moves), `candidates` (the finalists and their order
for ties), `rounds` (the measured ranking's verdict), `timing` (train steps timed in
interleaved rounds, more while undecided), `confirmation` (the measured
ranking and the longer confirmation), the stages `request`, `preparation`, `trials`,
`finalists` (evaluating the finalists) and `selection`, `driver` (`search()`), `result`
(`SearchResult`), `workers` (`search_in_processes`).
"""

from .budget import Budget
from .driver import search
from .evaluator import Evaluator, ProxyResult, clone_for_search
from .explore import Neighbour, explorer, neighbours
from .fidelity import (
    LOW_FIDELITY_STEPS,
    FidelityCheck,
    check_reference,
    confirmation_reasons,
    longer_batches,
    trivial_baseline,
)
from .heuristic import heuristic_plan
from .losses import CLASSIFICATION_LOSS_WORDS, has_classification_loss, rounding_floor_outputs
from .record import TrialRecord
from .result import ParetoPoint, SearchResult
from .settings import SearchSettings, StudyCallback
from .space import (
    SENSITIVE_CLASS_PATTERNS,
    Group,
    allowed_dtypes,
    compute_layers,
    float8_unsafe_layers,
    float16_unsafe_layers,
    group_layers,
    is_sensitive,
    make_groups,
    matches_any,
    output_layers,
    run_profiler,
)
from .storage import resolve_storage
from .timing import measure_step_rounds, measure_step_seconds
from .workers import search_in_processes

__all__ = [
    "CLASSIFICATION_LOSS_WORDS",
    "SearchSettings",
    "StudyCallback",
    "LOW_FIDELITY_STEPS",
    "SENSITIVE_CLASS_PATTERNS",
    "Budget",
    "Evaluator",
    "FidelityCheck",
    "Group",
    "Neighbour",
    "ParetoPoint",
    "ProxyResult",
    "SearchResult",
    "TrialRecord",
    "allowed_dtypes",
    "check_reference",
    "clone_for_search",
    "compute_layers",
    "confirmation_reasons",
    "explorer",
    "float8_unsafe_layers",
    "float16_unsafe_layers",
    "group_layers",
    "has_classification_loss",
    "heuristic_plan",
    "is_sensitive",
    "longer_batches",
    "make_groups",
    "matches_any",
    "measure_step_rounds",
    "measure_step_seconds",
    "neighbours",
    "output_layers",
    "resolve_storage",
    "rounding_floor_outputs",
    "run_profiler",
    "search",
    "search_in_processes",
    "trivial_baseline",
]
