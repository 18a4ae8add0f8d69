"""Side environments: nbgrader and verl, each in its own pinned venv."""
