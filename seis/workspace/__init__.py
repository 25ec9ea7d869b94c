"""Session workspaces: copy a parent engine tree, lay inherited material beside it, diff and hash it."""
from .diff import diff_trees, diff_workspace
from .materials import PeerMaterial, Report, Verdict, check_chain_id
from .prepare import PEERS_DIR, REPORTS_DIR, Workspace, prepare_workspace
from .tree import TreeError, copy_tree, tree_files, tree_hash

__all__ = ["PEERS_DIR", "REPORTS_DIR", "PeerMaterial", "Report", "TreeError", "Verdict", "Workspace",
           "check_chain_id", "copy_tree", "diff_trees", "diff_workspace", "prepare_workspace", "tree_files",
           "tree_hash"]
