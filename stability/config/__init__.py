"""Typed, validated configuration: the one schema from which the CLI flags, the TOML keys, the checkpoint's config
block and the validation derive (docs/configuration.md).

Every config is a frozen pydantic v2 model with ``extra="forbid"``: an unknown key is an error naming the allowed
ones, so that no key is ever silently ignored (the paper's release did that). Each field carries its help text
(``Field(description=...)``) and, where useful, its CLI ``metavar``/``flag`` (``json_schema_extra``); ranges are
``ge``/``le`` bounds; cross-field checks are ``model_validator``\\ s. Any failure is one :class:`ConfigError` line in
the style ``ModelConfig.width: 0 is outside [1, inf]`` (:func:`stability.config.messages.message` converts
pydantic's ValidationError).

``TrainConfig.method`` is a discriminated union (on ``name``) of :class:`Progressive`, :class:`DeepSupervision` and
:class:`Implicit`: the options of a method live in its block (``{"name": "implicit", "solver_tol": 1e-4}``; in TOML
``[train.method]``), so an explicit value is never an error, and an option of another method, or one given beside
the other train options, is refused naming the method and the table that has it. :func:`dotted` names every option
by its path (``train.method.solver_tol``): the keys of ``--where`` filters, of table columns and of config diffs.

The schema is a package, one module per concern, each importing only those below it: ``fields`` (the counts'
limits, a field with its help and bounds), ``messages`` (the one-line errors), ``base`` (the one config base,
devices, dotted paths), ``model`` (the model's and the task's tables), ``train`` (the methods, training, the run,
the presets), ``sweep`` (a grid's summary), ``analysis`` (the stages' names, the analysis options) and ``toml``
(a run file's tables). Every name is importable from here, as ``from stability.config import RunConfig``.
Torch-free.
"""

from stability.config.fields import (MAX_BITS, MAX_DIRECTIONS, MAX_EPOCHS, MAX_ITERATIONS, MAX_PROBES, MAX_SAMPLES,
                                     MAX_SEED, MAX_WIDTH, MAX_WORKERS, bounds, field_extra, limits, unwrap)
from stability.config.messages import method_option_message
from stability.config.base import (Device, Real, RecordPart, _Config, changes, dotted, from_dict, is_device_name,
                                   resolve_device, short_number, shortest_e, to_dict)
from stability.config.model import (InitialState, ModelConfig, NORMS, Norm, RECALLS, Recall, RopePrecision, TaskConfig,
                                    TaskName, WindowEdges)
from stability.config.train import (DecayExempt, DeepSupervision, EnsembleOptions, Implicit, ImplicitBackward, METHODS,
                                    METHOD_CLASSES, METHOD_OPTIONS, Method, MethodConfig, OPTION_METHOD, PRESETS,
                                    Progressive, RunConfig, SECTIONS, TrainConfig, is_flat_config, preset)
from stability.config.sweep import SweepSummary
from stability.config.analysis import (ANALYZE_STAGES, AnalysisOptions, DEFAULT_STAGES, EIG_ROUTE, Flag, GEOMETRY_STAGE,
                                       OPT_IN_STAGES, PATH_STAGE, STAGES, parse_stages)
from stability.config.toml import METHOD_KEYS, option_names, parse_toml, read_toml, section_options

#: the names the schema gives the package (the base and its dict form, the tables, the names they take)
__all__ = ["MAX_BITS", "MAX_DIRECTIONS", "MAX_EPOCHS", "MAX_ITERATIONS", "MAX_PROBES", "MAX_SAMPLES", "MAX_SEED",
           "MAX_WIDTH", "MAX_WORKERS", "bounds", "field_extra", "limits", "unwrap", "method_option_message", "Device",
           "Real", "RecordPart", "_Config", "changes", "dotted", "from_dict", "is_device_name", "resolve_device",
           "short_number", "shortest_e", "to_dict", "InitialState", "ModelConfig", "NORMS", "Norm", "RECALLS",
           "Recall", "RopePrecision", "TaskConfig", "TaskName", "WindowEdges", "DecayExempt", "DeepSupervision",
           "EnsembleOptions", "Implicit", "ImplicitBackward", "METHODS", "METHOD_CLASSES", "METHOD_OPTIONS", "Method",
           "MethodConfig", "OPTION_METHOD", "PRESETS", "Progressive", "RunConfig", "SECTIONS", "TrainConfig",
           "is_flat_config", "preset", "SweepSummary", "ANALYZE_STAGES", "AnalysisOptions", "DEFAULT_STAGES",
           "EIG_ROUTE", "Flag", "GEOMETRY_STAGE", "OPT_IN_STAGES", "PATH_STAGE", "STAGES", "parse_stages",
           "METHOD_KEYS", "option_names", "parse_toml", "read_toml", "section_options"]
