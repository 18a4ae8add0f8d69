"""The lessons: each lesson's record tests on its tiny run, and the GPU presets' rehearsals on CPU."""
