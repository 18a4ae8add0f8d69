"""The course's tests (``make test``; ``make test-fast`` leaves out the ones that execute whole lessons)."""
