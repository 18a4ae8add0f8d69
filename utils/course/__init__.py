"""Course tooling: what runs, checks, grades and hands out the lessons. No lesson imports it.

* ``run`` / ``summary``    -- execute lessons with papermill (``python -m utils run``) and summarise their records
* ``kernel``               -- papermill's execution, started again when a kernel dies before it starts (port race)
* ``lessons``              -- finding lessons, reading what a run was, cleaning executed notebooks for commit
* ``cells`` / ``labs``     -- the exercise contract and the student editions in ``labs/`` (``python -m utils labs``)
* ``solutions``            -- the reference solutions in ``utils/solutions/``, written from the lessons
* ``readme`` / ``exercise_index`` -- the README's lesson table and ``docs/exercises.md`` (what each exercise is
  checked against, read from its check and tests), written by ``make labs``
* ``grading`` / ``grade``  -- re-running answers and checks, and grading a class (``python -m utils grade``)
* ``submissions`` / ``sandbox`` -- reading a class's submissions safely; the bubblewrap sandbox each one runs in
* ``handout``              -- a student repository without the answers (``python -m utils handout``)
* ``twins`` / ``twin_lessons`` / ``twin_judges`` -- architecture twins: the GPU presets measured on any CUDA GPU
* ``tiny``                 -- building the embedded tiny model

Dependencies point one way: these modules import the lesson modules of ``utils`` (``presets``,
``records``, ``sft``, ...), never the reverse (``tests/course/test_layout.py`` checks the import graph).
"""
