"""Utilities: registries, environment report, visualization, plotting, distributed helpers.

Import from the submodules (e.g. `detcore.utils.visualizer.draw_instances`): they have different
dependencies, and importing `detcore.utils` should stay cheap.
"""
