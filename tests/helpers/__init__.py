"Test helpers for fastprofile's test suite"
