"""Data for the rank: CIFAR-10 fetched and verified (`cifar10`, `fetch`: no torch), synthetic
and CIFAR sources (`sources`), host and device loaders (`loaders`), and the assembly of a run's
train and eval data from its config (`pipeline`)."""
