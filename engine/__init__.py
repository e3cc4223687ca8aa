"""The pure core of Portcullis: bundles, policy evaluation, plans, pricing and audit
chaining. No sockets, no clocks it is not handed, no files beyond a bundle's."""
