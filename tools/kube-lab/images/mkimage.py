#!/usr/bin/env python3
"""Turns a root filesystem tarball into a one-layer image tarball in docker-archive form, which
`ctr images import` takes without any registry.

usage: mkimage.py ROOTFS.tar OUT.tar REF [REF ...] [--env K=V ...] [--user U] [--entrypoint PATH] [--workdir D]
"""
import argparse
import hashlib
import io
import json
import tarfile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rootfs")
    parser.add_argument("out")
    parser.add_argument("refs", nargs="+", help="name:tag, once per tag")
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--user", default="")
    parser.add_argument("--entrypoint", default="")
    parser.add_argument("--workdir", default="/")
    args = parser.parse_args()

    layer = hashlib.sha256()
    with open(args.rootfs, "rb") as f:
        while chunk := f.read(1 << 20):
            layer.update(chunk)
    config: dict = {
        "architecture": "amd64", "os": "linux",
        "config": {"Env": args.env, "User": args.user, "WorkingDir": args.workdir},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer.hexdigest()]},
        "history": [{"created_by": "tools/kube-lab/images/mkimage.py"}],
    }
    if args.entrypoint:
        config["config"]["Entrypoint"] = [args.entrypoint]
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = [{"Config": config_name, "RepoTags": args.refs, "Layers": [layer.hexdigest() + "/layer.tar"]}]
    with tarfile.open(args.out, "w") as out:
        for name, data in ((config_name, config_bytes), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            out.addfile(info, io.BytesIO(data))
        out.add(args.rootfs, arcname=layer.hexdigest() + "/layer.tar")


if __name__ == "__main__":
    main()
