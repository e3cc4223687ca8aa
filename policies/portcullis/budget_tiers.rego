# L3: budget tiers. As a team's named budget fills (input.facts.budgets: the highest
# utilisation the budget's current period has reached, so a tier never lapses within
# its window), its tiers substitute cheaper models. decision.rego re-authorises them.
package portcullis.budget_tiers

# {"model": the substitute, "tier": its name, ...} or null when no tier applies.
proposal(_, _, _, _) := null
