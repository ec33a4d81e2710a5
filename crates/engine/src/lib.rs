//! gdx-engine (being written).
