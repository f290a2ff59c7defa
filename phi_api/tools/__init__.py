"""What people run by hand: the command line, model preparation, random-weight shape models and benchmarks."""
