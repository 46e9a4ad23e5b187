from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command == "bash scripts/setup.sh && bash scripts/test.sh"
    assert "pytest -m 'not image and not untimed'" in (ROOT / "scripts" / "test.sh").read_text()
    assert f"```bash\n{ci_command}\n```" in readme


def _readme_default(text: str) -> list:
    """A default as README's limits table writes it, as the parser holds it."""
    words = {"any": [], "none": None, "1 MiB": 1 << 20}
    if text in words:
        return [words[text]]
    return [float(value.split()[0]) for value in text.split(", ")]


def test_the_limits_table_gives_the_cli_defaults():
    from realtime.cli import serve_parser

    actions = serve_parser()._actions
    defaults = {action.option_strings[0]: action.default for action in actions if action.option_strings}
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| limit | default |") :].split("\n\n")[0].splitlines()[2:]
    checked = 0
    for row in table:
        flags_cell, default_cell = (cell.strip() for cell in row.strip("|").split("|")[:2])
        flags = [flag.strip("` ") for flag in flags_cell.split(",")]
        written = _readme_default(default_cell)
        for flag, value in zip(flags, written * len(flags) if len(written) == 1 else written, strict=True):
            actual = defaults[flag]
            expected = float(actual) if isinstance(actual, int | float) else actual
            if flag == "--api-key":  # from VOXRT_API_KEY when set
                continue
            assert value == expected, (flag, default_cell, actual)
            checked += 1
    assert checked >= 10
