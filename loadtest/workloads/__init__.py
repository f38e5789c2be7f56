"""What a load level sends, as plain data: datasets, lengths, arrivals and service tiers.

`workload.Workload.plan(level, index)` gives a level's `plan.Plan`: sessions of turns, when each
session starts, what each turn says (`text`) and how many tokens it asks for. Nothing here sends a
request or reads a clock: `loadtest.load.run_plan` executes a plan over HTTP, and a model of the
server can run the same plan in virtual time. One module per dataset (`random_prompts`,
`shared_prefix`, `multi_turn`, `trace`), plus `lengths`, `arrivals`, `tiers` and `level`.
"""
