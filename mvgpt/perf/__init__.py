"""Speed (docs/performance.md): the one-token step in C, CPU attention, measuring the machine, and the main
job's plan."""
