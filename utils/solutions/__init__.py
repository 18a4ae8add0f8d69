"""Reference solutions of the graded exercises, one module per lesson (``lesson04.group_advantages``).

Every ``lessonNN.py`` here is written by ``python -m utils labs build`` from that lesson's answer
cells: edit the lesson, never these files. The tests check the answers against TRL and
bitsandbytes through them, and a later lesson that needs an earlier lesson's answer imports it from
here. No lesson helper in ``utils`` uses them, so a student handout (``make handout``) can leave
out the lessons it withholds.
"""
