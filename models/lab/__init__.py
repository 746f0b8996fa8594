"""The embedded lab: synthetic reasoning tasks and a programmatic teacher (`tasks`), the lab's
tokenizer (`tokenizer`), a ladder of small Llama students and its teachers, pretrained by the tool
on first use and cached under `$ADVISOR_HOME/lab` (`ladder`, `train`), the builds kept in the
repository (`committed`), and the real pretrained students the lab names (`pretrained`).

    from capacity_advisor.models.lab.ladder import student_path
    from capacity_advisor.models.lab.tasks import make_problems
    path = student_path("xs")                       # an ordinary HF model folder
    problems = make_problems("modchain", 200)

Importing any of them is cheap: torch and transformers load only when a student is built. The lab's
pools (the scripted teacher's candidates as a grouped pool) are `advisor.pools.lab`.
"""
