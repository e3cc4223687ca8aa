# L4: intent / complexity tiers. A router chooses a capability tier for a request from
# the features the gateway measured (input.facts.features), the classifier's prediction
# when one ran (input.facts.classifier), and the tier already pinned to the session
# (input.facts.session); the tier names the model. decision.rego re-authorises it.
package portcullis.intent

# {"model": the tier's model, "tier": its name, ...} or null when no router applies.
proposal(_, _, _, _) := null
