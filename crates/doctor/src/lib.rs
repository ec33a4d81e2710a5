//! gdx-doctor (being written).
