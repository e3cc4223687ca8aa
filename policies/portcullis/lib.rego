# Helpers more than one concern needs. Every other package's helpers are private
# (`_name`) to it; a package reaches another's rules by their full path
# (data.portcullis.lib.covers), never through `import`: in regorus an imported
# package's rule, read through the import's name, evaluates the whole package
# document (milliseconds), where the full path evaluates that one rule.
package portcullis.lib

# Whether a policy's `teams` list names the team, directly or with "*".
covers(teams, team) if team in teams

covers(teams, _) if "*" in teams

# Whether a target stays inside a region lock: every region it may process a request
# in, which is its `regions` (a cross-region inference profile routes among them) or
# else its one `region`. Null locks nothing.
target_within(null, _) := true

target_within(regions, target) if {
	every region in object.get(target, "regions", [target.region]) {
		regions[region]
	}
}
