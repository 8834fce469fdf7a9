"""mcq-v1: multiple-choice questions; `items` renders and grades them under any
label scheme, option order and template (the robustness probes use it)."""
