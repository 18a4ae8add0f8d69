"""Run in the nbgrader venv (tests/side/test_nbgrader.py): ``nbgrader generate_assignment`` for several assignments
in one process, through nbgrader's own API (``NbGraderAPI.generate_assignment``, what the command line runs).

Usage: python generate.py COURSE_DIR ASSIGNMENT [ASSIGNMENT ...]; prints one JSON line: assignment ->
{"success": bool, "log": str}.
"""
import json
import sys

from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from traitlets.config import Config

course, assignments = sys.argv[1], sys.argv[2:]
config = Config()
config.CourseDirectory.root = course
config.CourseDirectory.course_id = "post-training"
api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
results = {}
for assignment in assignments:
    result = api.generate_assignment(assignment, force=True)
    results[assignment] = {"success": bool(result["success"]),
                           "log": (result.get("error") or "") + (result.get("log") or "")}
print(json.dumps(results))
