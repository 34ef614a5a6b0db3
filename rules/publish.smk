# Correction sections for published speed tables (config/claims/): the upstream file with the
# section in it, the section alone and the diff. A branch or a pull request only if publish.* asks.
from crashline.config import claims as crashline_claims  # noqa: E402

CLAIMS = {c["name"]: c for c in crashline_claims.load_claims(CFG["claims"], CFG)}
PUBLISH = f"{RESULTS}/publish"


wildcard_constraints:
    claim="[A-Za-z0-9][A-Za-z0-9._-]*",


rule publish_claim:
    input:
        # the claims file and the copy of the upstream file it corrects
        claims=lambda wildcards: CLAIMS[wildcards.claim]["path"],
        upstream=lambda wildcards: CLAIMS[wildcards.claim]["source"]["local_copy_path"],
        configs=LAYOUT.configs_table(),
        measurements=LAYOUT.measurements_table(),
    output:
        readme=f"{PUBLISH}/{{claim}}/README.md",
        section=f"{PUBLISH}/{{claim}}/correction.md",
        diff=f"{PUBLISH}/{{claim}}/correction.diff",
        record=f"{PUBLISH}/{{claim}}/publish.json",
    log:
        f"{RESULTS}/logs/publish/{{claim}}.log",
    conda:
        "../envs/crashline.yaml"
    params:
        publish=json.dumps(CFG["publish"], sort_keys=True),
        out_dir=lambda wildcards: f"{PUBLISH}/{wildcards.claim}",
    script:
        "../scripts/job.py"


# Not part of the default target: `snakemake --cores 1 publish`.
rule publish:
    input:
        expand(f"{PUBLISH}/{{claim}}/publish.json", claim=sorted(CLAIMS)),
