# Helpers more than one concern needs. Every other package's helpers are private
# (`_name`) to it; a package reaches another's rules by their full path
# (data.portcullis.lib.covers), never through `import`: in regorus an imported
# package's rule, read through the import's name, evaluates the whole package
# document (milliseconds), where the full path evaluates that one rule.
package portcullis.lib

# Whether a policy's `teams` list names the team, directly or with "*".
covers(teams, team) if team in teams

covers(teams, _) if "*" in teams

# Whether a region is inside a region lock; null locks nothing.
region_within(null, _) := true

region_within(regions, region) if regions[region]
