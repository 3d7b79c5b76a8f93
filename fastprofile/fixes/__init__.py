"Acting on a profile: `compare` two profiles, `check_advice`, `Learner.tune`."
