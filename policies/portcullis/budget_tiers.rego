# L3: budget tiers. As a team's named budget fills, its tiers substitute cheaper
# models (data.portcullis.budget_tiers.teams: a team's own entry, else "*"). The
# gateway measures each budget's utilisation before the decision
# (input.facts.budgets[<rule name>].percent): the highest value the budget's counter
# has reached in its current period, as a percent of the rule's limit, so a tier never
# lapses within its window. decision.rego re-authorises every proposal.
package portcullis.budget_tiers

# METADATA
# title: Budget tier proposal
# description: >-
#   The highest tier the team's budget has reached whose substitutions name the model
#   so far: {"model": its substitute, "tier", "budget", "threshold_percent"}; null
#   when no tier applies, or the budget's utilisation is not known (no fact).
#   Tiers are in ascending threshold order (checked when the bundle is activated).
proposal(principal, _, model, facts) := {
	"model": tier.substitutions[model],
	"tier": tier.name,
	"budget": config.budget,
	"threshold_percent": tier.threshold_percent,
} if {
	budgets := facts.budgets # read first: a request without the fact costs one lookup
	teams := data.portcullis.budget_tiers.teams
	config := object.get(teams, principal.team, object.get(teams, "*", null)) # a team's own tiers replace the ones every team gets
	percent := budgets[config.budget].percent
	reached := [t | some t in config.tiers; t.threshold_percent <= percent; t.substitutions[model]]
	count(reached) > 0
	tier := reached[count(reached) - 1]
} else := null
