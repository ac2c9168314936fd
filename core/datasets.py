"""The datasets training and evaluation read, fetched into the layout they expect (`make data`).

    python -m core.datasets --out data/datasets                  # online: from the sources below
    python -m core.datasets --out data/datasets --from FOLDER    # offline: from a folder you carried over

The layout, which core.data and evaluation.sts_data find under a --data-dir (DATA= in the Makefile):

    senteval/STS/STS12-en-test ... STS16-en-test   SemEval STS 2012-2016, SentEval's files
    senteval/STS/STSBenchmark                      STS-B train/dev/test
    senteval/SICK                                  SICK train/trial/test
    senteval/SNLI                                  SNLI dev/test as s1/s2/labels
    corpus/wordnet-sentences.txt                   the quick presets' unlabeled sentences (no download: local only)
    wiki1m_for_simcse.txt                          the paper presets' unlabeled sentences (SimCSE's Wikipedia million)

Sources. The STS, STS-B, SICK and SNLI files are SentEval's processing of the originals (SemEval's STS task
pages, the STS wiki, SICK's and SNLI's sites), in the folder SentEval's own download script builds. That script
fetches from hosts that are mostly gone (the STS wiki at ixa2.si.ehu.es); the one archive of exactly these files
that the papers we reproduce use and that is still served is SimCSE's `senteval.tar` (SentEval's data/downstream
folder) on the Hugging Face hub, so that is where `make data` downloads them from. The sentence corpus is
SimCSE's `wiki1m_for_simcse.txt` from the same place. corpus/wordnet-sentences.txt was built for this project
from WordNet 3.0 (see the data README that ships with it) and has no download: it comes from a local folder.

Checksums, plainly: this module was written on a machine without internet, so it holds no sha256 of the
downloaded archives themselves (Source.sha256 is None: we would not invent one). What it holds, in FILES, is
the sha256 of every file of the layout as the project's reference copy of the data has them, and nothing is
written under --out that does not match: a download or a local folder whose files differ is refused file by
file. wiki1m_for_simcse.txt is not in that reference copy, so its sha256 is unknown too: it is downloaded
unverified, said so on the console, and its sha256 is written to <out>/SHA256SUMS (as every file's is) so
that later copies can be checked against the first (`sha256sum -c SHA256SUMS` in <out>).

Offline, --from takes a folder holding the layout (e.g. the project's shared data folder), SentEval's
data/downstream layout (STS/, SICK/, SNLI/ at its top), or the downloaded files themselves (senteval.tar,
wiki1m_for_simcse.txt, fetched elsewhere with the URLs below).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

#: sha256 of every file of the layout, by folder: the project's reference copy (see the module docstring).
_SHA256: dict[str, dict[str, str]] = {
    "corpus": {
        "wordnet-sentences.txt": "f22a8dfe083d489c1ad5bdd761f4f69bda8486a0c3c2fa76c3675f644a15a409",
    },
    "senteval/SICK": {
        "SICK_test_annotated.txt": "4c9aa1bb3c5bbf732520fe35b23c121739472a38eb47e7d5336e6df51896be02",
        "SICK_train.txt": "d07bdb73963dda1b2012f4d78c24044cd9503b1109218a518a481616973cf960",
        "SICK_trial.txt": "0d0786bd8671a0a70614f2f890b8ab24b3c24d1ccb624bcca87618091fbe4f11",
    },
    "senteval/SNLI": {
        "labels.dev": "d164d72435c3289fe53cb01e983f7c06e104bf192c0cae9caf2e99bf2e15f974",
        "labels.test": "e25c363e5cc70d5494d6e6555d8053eced22dca836e0f03067530eaad3d4f5f5",
        "s1.dev": "28a398b5478b10b4b851d4bb5b2e5767171519add6586015ed50b9436df11d00",
        "s1.test": "62cb8107dc3c56a4376e5e521842be24e0d61c92c346b94917da2bbf2a47d8be",
        "s2.dev": "a8c59709630b64ba103f7784c0cb7104a6baf23234562487264d9634714f5d2b",
        "s2.test": "1174f3ad30a3c30fc0f9eeffc1b3b6a79e0514026c5a658968a8e2a324b311a1",
    },
    "senteval/STS/STS12-en-test": {
        "00-readme.txt": "d47be1641ac98ac312de6f0746b65683df392f70d843eaac9fb10ebd4cb4cb63",
        "STS.gs.ALL.txt": "5bcbfda125ad56a1b924763482420b585bea9bf74dc2c18d88d62cd6d2e3422f",
        "STS.gs.MSRpar.txt": "5526be59228bc34ccb3cb6f1f56c0d7278d3419b8886713ae016fd92b151f19c",
        "STS.gs.MSRvid.txt": "9c6096c6bcfb0144c8bbddb00900ca9198c88498630cd0c8f08d18365f1d7150",
        "STS.gs.SMTeuroparl.txt": "708530c4d006d06881f3289fce35d624d7efe562dcf0fe5f8aa0eec3a135f6d4",
        "STS.gs.surprise.OnWN.txt": "088d8ca22c0aa406e4a5d2e6e308a4f38b482b8e736c2445a38ffb6e4c4fb4fd",
        "STS.gs.surprise.SMTnews.txt": "aa6dfc868db333c43dc59be14d46fa6587c7ebddc0d497e717f647bf35121cf1",
        "STS.input.MSRpar.txt": "093b36d9cc1cd26364885c0f5d5be7ed024f475bceb552384f7fd489174b3c4f",
        "STS.input.MSRvid.txt": "5a007f6882ed3398afdbb0d1ed093457c4adbac82a5b411ea356e0985650c39f",
        "STS.input.SMTeuroparl.txt": "971d76409ebd10a2285a846a20fd035e4e4ba2f85054e2869f5b41bb3182ca82",
        "STS.input.surprise.OnWN.txt": "1059c1b66fc72071881175754d3a01158e423ec6b032e1dd87b18fc7ecb1e8d9",
        "STS.input.surprise.SMTnews.txt": "048cbedbba58a136722e9d102f0416326aa04644180e031318c28caf90258585",
    },
    "senteval/STS/STS13-en-test": {
        "00-readme.txt": "531ee28a3787b11dd14dda8d809e724479d87f9705120494aad584c9cb14a6ce",
        "STS.gs.FNWN.txt": "8ca95b7228119578e2007839cf7969f22c4f1fd41fd610c4b7f9683072d98066",
        "STS.gs.OnWN.txt": "0cd497aaddb00a2fb6db25f77bccfc09e8aa012e11549b81b434bab1a27ad954",
        "STS.gs.SMT.txt": "a09775ba2fafc9cbe0a7d0a08f0c729789b0d6c99dc4867a86b45b71a73f004e",
        "STS.gs.headlines.txt": "f49f64089011436dd296ef384c07160219406feef7dc4b9fa2af52a519f32bc6",
        "STS.input.FNWN.txt": "7bcc0fc86d30c8980c9ac9735c612492abd236524bec32bed98070e225b2e023",
        "STS.input.OnWN.txt": "3c616d878f3d7bfbadce1657bcc5a78d7d429fd10fc2e31195d314543fecab1a",
        "STS.input.headlines.txt": "e60c724b4b620802f42d7696f27e6a8153205a716b142f0a051e2b2b2e99e505",
    },
    "senteval/STS/STS14-en-test": {
        "00-readme.txt": "9fe9d64362ac42ed24010d5b00f227235a660dc2466fba743f31051fd121ef73",
        "STS.gs.OnWN.txt": "1c80147df270ea4cfce14a47ed29f8a2f10d5dc016d02836077fd786ff7f535b",
        "STS.gs.deft-forum.txt": "ba6dc76696b5c93985590a325b4d142449932cdf0d715b2bab1b1743fe3c488c",
        "STS.gs.deft-news.txt": "105c5b333abd50c274efb4dae9e3e0dab36ed63eee780cfb49955b1586bd62f2",
        "STS.gs.headlines.txt": "f243c34647255cd0b994565ed4f58dd31506e7d9c9d6250d1a6dd14095625832",
        "STS.gs.images.txt": "fc994ebacc7074c332626fa9e29542d7340a48a3cdb999b47cdb59c378523a62",
        "STS.gs.tweet-news.txt": "0098c644bfeaa2d511a8297b1940771865900c372c9dd49a62726dc5ec02c9a3",
        "STS.input.OnWN.txt": "52f462f085f6920f70115761c50924f16a4fd6caec2cfccec82311619c1be326",
        "STS.input.deft-forum.txt": "7d52c9b130cf0d0291b2f2ea5324363219267ffcecf0a56f4306503adb231714",
        "STS.input.deft-news.txt": "2416e9f1a13136ac213cbfd413d98cd8504edcca21c87deef3aa5c1207bc1448",
        "STS.input.headlines.txt": "08e808b7786ec7b830badf9843c55fc7930467ae75e2cd6fe8fd518496b66730",
        "STS.input.images.txt": "3d44abc6af8d8b1c69b6e93bb386176d5896985dba91a13e5587350e92a90c83",
        "STS.input.tweet-news.txt": "6b0173393868ea87f315f32971bff68b328e466678f481d4710d8488e7cc90de",
    },
    "senteval/STS/STS15-en-test": {
        "00-readme.txt": "38fe35ef21a0f224b6cc51e00d138810063521cd90458a7d77e4e0aa3a79542d",
        "STS.gs.answers-forums.txt": "1644301a7540e5484da285002e9269062852efb2272be614cad99c9530f6a102",
        "STS.gs.answers-students.txt": "028db213140f8c7aef7497c4ae38b6380938f20359852231669c83dce11c3701",
        "STS.gs.belief.txt": "5736192faaccbdbecd0ef6b73ec04b24115cd2e48d55dc3b1b170da3d2a81c75",
        "STS.gs.headlines.txt": "e8e432f769c8a94ddb62ae3343890ac24a9dd78a116d56c707313bc59413dd56",
        "STS.gs.images.txt": "ed8878209098c77ca7f02ac413d3fd698f92ad3425999555e50fda89fc46012a",
        "STS.input.answers-forums.LICENSE": "65718ec23624d97933308adc08cb270db798cdd5593d35501be9bfda5ba1a28a",
        "STS.input.answers-forums.txt": "65e3f55333c53897c6791ff154a490857a827d4699bc2d1f18e53693dbfd0c39",
        "STS.input.answers-students.txt": "4893f736e84cea176c39c882250f6513d5bbcfa6ebe8d3ffabcef6056d0471a7",
        "STS.input.belief.txt": "ce09c4713480fd622afbc362d22dd7ffb4e5fc6ee676602368af6f63f9ea7cb5",
        "STS.input.headlines.txt": "91f2a6152c574e17544c5e8a856338fa8632898b44c10d2cc9c9516ddfe682c5",
        "STS.input.images.txt": "98b2f560e4a3e13253f10b7fd8855006dd327ab272559ab690f2c4e1e5aebca7",
    },
    "senteval/STS/STS16-en-test": {
        "LICENSE.txt": "94b7380d16f832ae97bcb48536f22fe9a22e8e20f8cf88a9298f65c556e3a6f2",
        "README.txt": "1b74b4c84a59f139153f0348e212bfdb33dffd3b008dfb2c4f7728c4fa27141f",
        "STS.gs.answer-answer.txt": "332efd741b0cb247d20dd2a6cec854360c921c7e6b395f328f562d8d26057214",
        "STS.gs.headlines.txt": "01e33a95996201a6e81e3cce9eda0f15048b77613ea64dce2929bb35479f7d85",
        "STS.gs.plagiarism.txt": "29984944a91aaff484f2b2e5d4d434fc8a6f5ef6f578a880cccd2786f5142fdc",
        "STS.gs.postediting.txt": "81947ed9dbe7f85b7bd249df68ed5c7b2f16f06390ad568eb5554b1e26bc5577",
        "STS.gs.question-question.txt": "cf9ebf9d140191f73620cda0560947ad9283c910735d0d541b8a401a5e64afb0",
        "STS.input.answer-answer.txt": "92e66262159e39cb623690e243179f447fb08d493ccec6e600a021b76dd6fe9a",
        "STS.input.headlines.txt": "f439e10cf28d9cb4dc7642a072f6ac9ac48922f147241af8fe5df3048f24804b",
        "STS.input.plagiarism.txt": "78f5fb0756400485676f82a47703dab0402ba273a887a6d846e9790ff9300f87",
        "STS.input.postediting.txt": "cb8e2337a17ecc60a4fb57ecb17c692e13257802d24c9bd401b4bfa574510463",
        "STS.input.question-question.txt": "0b8d495236ea8c9e9eddf529b40d8570e4b38ef29a40d194d5487613b064a4bc",
    },
    "senteval/STS/STSBenchmark": {
        "LICENSE.txt": "3dfc3217395f8c5dd05c5f8995f25fe2f8fd258e6dd770b3de480749caee8c70",
        "readme.txt": "e9488363d211c32ca5e912954f16eb9233cfed1b5b4b0475d0d812d35d7c8ef1",
        "sts-dev.csv": "fd3e4e429f32e352c7c7c76aea5c3383ee95eb98e482796b34e4e7b88a8392f3",
        "sts-test.csv": "4cde2a19c9b7232c9ce92a89e5afd99805c8f66ba432a7824e0a5bad1a0a0ea0",
        "sts-train.csv": "6466868d4b49a575530554224fe2e7d8cc03e83e1f326c90e561b81bf5031fec",
    },
}
FILES: dict[str, str] = {f"{folder}/{name}": digest for folder, names in _SHA256.items()
                         for name, digest in names.items()}

SIMCSE_DATA = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/"
WIKI1M = "wiki1m_for_simcse.txt"
CORPUS = "corpus/wordnet-sentences.txt"
#: the offline spelling, for messages
FROM_HINT = "make data FROM=<folder>"


@dataclass(frozen=True)
class Source:
    """One download: a file at `url` that is either a tar archive holding layout files or one layout file itself."""

    name: str
    url: str | None  # None: nothing to download, a local folder only
    filename: str  # the downloaded file's name; a --from folder may hold it too
    files: tuple[str, ...]  # the layout paths it gives
    sha256: str | None = None  # of the downloaded file, where known (see the module docstring)
    inner_prefix: str = ""  # a layout path less this is the file's path inside the archive (its end)
    required: bool = True  # without it `make data` fails; the corpora are each optional
    note: str = ""  # said when it is missing

    @property
    def is_archive(self) -> bool:
        return self.filename.endswith((".tar", ".tar.gz", ".tgz"))


SOURCES: tuple[Source, ...] = (
    Source("SentEval's STS12-16, STS-B, SICK and SNLI files (SimCSE's senteval.tar)", SIMCSE_DATA + "senteval.tar",
           "senteval.tar", tuple(p for p in FILES if p.startswith("senteval/")), inner_prefix="senteval/"),
    Source("SimCSE's one million Wikipedia sentences", SIMCSE_DATA + WIKI1M, WIKI1M, (WIKI1M,), required=False,
           note="the paper presets' unlabeled corpus (--train-data text:wiki1m_for_simcse.txt)"),
    Source("WordNet 3.0 sentences (this project's stand-in corpus)", None, "wordnet-sentences.txt", (CORPUS,),
           required=False, note="the quick presets of simcse, conisi and infocse train on it; it has no download: "
           "copy it with `make data FROM=<a folder holding corpus/wordnet-sentences.txt>`, or train on "
           "--train-data text:wiki1m_for_simcse.txt"),
)


@dataclass
class Report:
    """What happened to each layout file: ok, unverified (no known sha256), missing or mismatch (refused)."""

    status: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what failed a required source, or any checksum
    notes: list[str] = field(default_factory=list)  # what an optional source lacks

    def failed(self, sources: tuple[Source, ...]) -> bool:
        needed = {f for s in sources if s.required for f in s.files}
        return any(v == "mismatch" for v in self.status.values()) or \
            any(self.status.get(f) != "ok" for f in needed)


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _put(out: Path, rel: str, open_source: Callable, expected: str | None, report: Report, log) -> None:
    """Copy one file into out/rel through a temporary name; kept only if its sha256 is the expected one."""
    target = out / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    with open_source() as src, open(part, "wb") as dst:
        while chunk := src.read(1 << 20):
            digest.update(chunk)
            dst.write(chunk)
    got = digest.hexdigest()
    if expected is not None and got != expected:
        part.unlink()
        report.status[rel] = "mismatch"
        report.problems.append(f"{rel}: sha256 {got}, expected {expected}: refused (not written)")
        return
    os.replace(part, target)
    report.status[rel] = "ok" if expected is not None else "unverified"
    if expected is None:
        log(f"  {rel}: UNVERIFIED (no known sha256; this copy's is {got}, written to SHA256SUMS)")


def _archive_members(archive: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    return {m.name.removeprefix("./"): m for m in archive.getmembers() if m.isfile()}


def _member(members: Mapping[str, tarfile.TarInfo], inner: str) -> tarfile.TarInfo | None:
    """The archive's file at `inner`, under whatever folder the archive puts its files (shortest path wins)."""
    found = [name for name in members if name == inner or name.endswith("/" + inner)]
    return members[min(found, key=len)] if found else None


def _local_candidates(folder: Path, source: Source, rel: str) -> Iterator[Path]:
    inner = rel.removeprefix(source.inner_prefix)
    yield folder / rel  # our layout
    for base in ("", "downstream/", "data/downstream/"):  # SentEval's layout, or the folder of one file
        yield folder / (base + inner)
    if not source.is_archive:
        yield folder / source.filename


def _download(source: Source, downloads: Path, log) -> Path:
    """The source's file under `downloads` (kept there: a second `make data` does not fetch it again)."""
    assert source.url is not None
    path = downloads / source.filename
    if not path.is_file():
        log(f"  downloading {source.url}")
        request = urllib.request.Request(source.url, headers={"User-Agent": "sembed-make-data"})
        part = path.with_name(path.name + ".part")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                downloads.mkdir(parents=True, exist_ok=True)
                with open(part, "wb") as f:
                    shutil.copyfileobj(response, f, 1 << 20)
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
    if source.sha256 is not None and (got := sha256_of(path)) != source.sha256:
        path.unlink()
        raise ValueError(f"{source.url}: sha256 {got}, expected {source.sha256}: refused and deleted")
    return path


def fetch(out: Path, from_dir: Path | None = None, sources: tuple[Source, ...] = SOURCES,
          checksums: Mapping[str, str | None] = FILES, log=print) -> Report:
    """Every source's files into `out`, from `from_dir` (offline) or downloaded; each checked against
    `checksums` (a path missing there, or mapped to None, is unverified). Files already in `out` with the right
    sha256 stay as they are."""
    out = Path(out)
    report = Report()
    for source in sources:
        log(f"{source.name}:")
        todo = []
        for rel in source.files:
            expected = checksums.get(rel)
            if expected is not None and (out / rel).is_file() and sha256_of(out / rel) == expected:
                report.status[rel] = "ok"
            else:
                todo.append(rel)
        if not todo:
            log(f"  {len(source.files)} file(s) already in {out}, checked")
            continue
        archive_path: Path | None = None
        if from_dir is not None:
            for rel in list(todo):
                local = next((p for p in _local_candidates(Path(from_dir), source, rel) if p.is_file()), None)
                if local is not None:
                    _put(out, rel, partial(open, local, "rb"), checksums.get(rel), report, log)
                    todo.remove(rel)
            if todo and source.is_archive and (Path(from_dir) / source.filename).is_file():
                archive_path = Path(from_dir) / source.filename
        elif source.url is not None:
            try:
                archive_path = _download(source, out / ".downloads", log)
            except (OSError, ValueError) as e:  # URLError is an OSError: no network, a 404, a full disk
                (report.problems if source.required else report.notes).append(
                    f"{source.name}: could not download {source.url}: {e}; offline? {FROM_HINT}")
        if archive_path is not None and not source.is_archive:
            rel = todo.pop()
            _put(out, rel, partial(open, archive_path, "rb"), checksums.get(rel), report, log)
        elif archive_path is not None:
            with tarfile.open(archive_path) as archive:
                members = _archive_members(archive)
                for rel in list(todo):
                    member = _member(members, rel.removeprefix(source.inner_prefix))
                    if member is not None:
                        _put(out, rel, partial(archive.extractfile, member), checksums.get(rel), report, log)
                        todo.remove(rel)
        for rel in todo:
            report.status.setdefault(rel, "missing")
        done = sum(report.status.get(rel) in ("ok", "unverified") for rel in source.files)
        log(f"  {done} of {len(source.files)} file(s) in {out}" + (f"; missing: {', '.join(todo[:3])}"
            f"{' ...' if len(todo) > 3 else ''}" + (f" ({source.note})" if source.note else "") if todo else ""))
    sums = "".join(f"{sha256_of(out / rel)}  {rel}\n" for s in sources for rel in s.files
                   if report.status.get(rel) in ("ok", "unverified"))
    listing = out / "SHA256SUMS"
    try:
        if not listing.is_file() or listing.read_text() != sums:
            listing.write_text(sums)
    except OSError as e:  # a read-only folder checked in place (make data DATA=<it>)
        report.notes.append(f"SHA256SUMS not written in {out}: {e}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the data folder to fill (DATA=, data/datasets)")
    parser.add_argument("--from", dest="from_dir", type=Path, help="offline: a folder holding the files (the "
                        "layout, SentEval's, or the downloaded senteval.tar / wiki1m_for_simcse.txt)")
    args = parser.parse_args(argv)
    if args.from_dir is not None and not args.from_dir.is_dir():
        parser.error(f"--from {args.from_dir}: no such folder")
    report = fetch(args.out, args.from_dir)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    if report.failed(SOURCES):
        where = f"in {args.from_dir}" if args.from_dir else "from the downloads"
        print(f"error: the evaluation and training sets are not complete {where}; nothing that did not match its "
              f"sha256 was written", file=sys.stderr)
        return 1
    print(f"ready: pass {args.out} as DATA= (make) or --data-dir (the commands); SHA256SUMS there lists every file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
