"""The product side of routing evaluation: `live` asks a running deployment (both tiers) and
builds the table `tandem eval` scores; the maths stays in `router.evaluation`."""
