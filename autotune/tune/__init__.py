"""Stage 7, tune: search. Strategies propose configs, one loop evaluates each through the
measure stage, records it in the store and tells the strategy; backends run trials live on a
GPU or replay a recording. Imports every earlier stage."""
